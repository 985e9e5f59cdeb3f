package yamlerr

import (
	"errors"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  string
		line int
		msg  string
	}{
		{"line", "yaml: line 3: did not find expected key", 3, "invalid YAML: did not find expected key"},
		{"no line", "yaml: control characters are not allowed", 0, "invalid YAML: control characters are not allowed"},
		{"line not a number", "yaml: line x: odd", 0, "invalid YAML: line x: odd"},
		{"no prefix", "unexpected EOF", 0, "invalid YAML: unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			line, msg := Split(errors.New(tt.err))
			if line != tt.line || msg != tt.msg {
				t.Errorf("Split(%q) = %d, %q; want %d, %q", tt.err, line, msg, tt.line, tt.msg)
			}
		})
	}
}

// indentHint and tabs are what Locate says of a mistake of indentation.
const (
	indentHint = ": check this line's indentation (spaces only; a key lines up with its mapping's other keys, a '-' with its list's other items)"
	tabs       = "invalid YAML: tabs are not allowed for indentation (this line is indented with one): indent with spaces"
)

// TestLocate: a mistake is placed on the line the parser could not read,
// not on the line where the mapping or list around it starts, and one of
// indentation says so.
func TestLocate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		line int
		msg  string
	}{
		{
			name: "a key indented too little",
			doc:  "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n     burst: 10\n  - key: ip\n",
			line: 7, msg: "invalid YAML: did not find expected key" + indentHint,
		},
		{
			name: "a list item indented too much",
			doc:  "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n   - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
			line: 7, msg: "invalid YAML: did not find expected '-' indicator" + indentHint,
		},
		{
			name: "a flow mapping left open",
			doc:  "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5\n  - key: b\n",
			line: 4, msg: "invalid YAML: did not find expected ',' or '}'",
		},
		{
			name: "already the right line",
			doc:  "domain: api\ndescriptors:\n  - key: user\n    descriptors:\n    - key: path\n       value: /login\n",
			line: 6, msg: "invalid YAML: mapping values are not allowed in this context" + indentHint,
		},
		{
			// The parser says "found character that cannot start any
			// token", or that a tab "violates indentation", without the word
			// that helps: tabs (issue 35).
			name: "a key indented with a tab",
			doc:  "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n\tunit: minute\n",
			line: 5, msg: tabs,
		},
		{
			name: "a list item indented with a tab",
			doc:  "domain: api\ndescriptors:\n  - key: user\n\trate_limit: {unit: minute, requests_per_unit: 5}\n",
			line: 4, msg: tabs,
		},
		{
			name: "in the second document, without a final newline",
			doc:  "domain: a\n---\ndomain: b\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n     burst: 10",
			line: 8, msg: "invalid YAML: did not find expected key" + indentHint,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := parse([]byte(tt.doc))
			if err == nil {
				t.Fatal("the document parses")
			}
			line, msg := Locate([]byte(tt.doc), err)
			if line != tt.line || msg != tt.msg {
				t.Errorf("Locate = %d, %q; want %d, %q (the parser said %v)", line, msg, tt.line, tt.msg, err)
			}
		})
	}
}

// TestLocateLarge: above MaxLocate, Locate does not search.
func TestLocateLarge(t *testing.T) {
	t.Parallel()
	doc := "a:\n  b: 1\n c: 2\n" + "# " + strings.Repeat("x", MaxLocate) + "\n"
	err := parse([]byte(doc))
	if err == nil {
		t.Fatal("the document parses")
	}
	wantLine, _ := Split(err)
	if line, _ := Locate([]byte(doc), err); line != wantLine {
		t.Errorf("Locate = line %d, want the parser's %d", line, wantLine)
	}
}

// FuzzLocate: whatever the document, Locate places a mistake on one of its
// lines (or the one after its last, or 0: none) and calls it invalid YAML.
func FuzzLocate(f *testing.F) {
	f.Add("a:\n  b: 1\n c: 2\n")
	f.Add("a: [1, 2\nb: 3")
	f.Add("- a\n - b\n")
	f.Add("a: \"open\n")
	f.Add("\t- x\n")
	f.Fuzz(func(t *testing.T, doc string) {
		err := parse([]byte(doc))
		if err == nil {
			return
		}
		line, msg := Locate([]byte(doc), err)
		lines := strings.Count(doc, "\n") + 1
		if line < 0 || line > lines+1 || !strings.HasPrefix(msg, "invalid YAML: ") {
			t.Fatalf("Locate = %d, %q for a document of %d lines (%v)", line, msg, lines, err)
		}
	})
}
