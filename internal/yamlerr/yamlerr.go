// Package yamlerr reads the errors of the YAML parser (go.yaml.in/yaml/v3)
// for the file:line reports of the rule and configuration files.
package yamlerr

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Split splits the YAML parser's "yaml: line N: msg" into its line and
// the message "invalid YAML: msg"; the line is 0 when err names none.
func Split(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if line, err := strconv.Atoi(n); err == nil {
				return line, "invalid YAML: " + after
			}
		}
	}
	return 0, "invalid YAML: " + msg
}

// MaxLocate is the largest document Locate searches for the line of a
// mistake, in bytes: the search parses the document about log2(lines)
// times. Above it, Locate says what Split says.
const MaxLocate = 1 << 20

// Locate returns the line of data at which the YAML parser met the mistake
// err (which decoding data returned) and the message "invalid YAML: msg",
// with what to look at when the parser's words are about indentation
// (hint).
// The parser names the line where the enclosing mapping or list starts,
// not the line it could not read (an indentation mistake on line 7 of a
// list that starts on line 2 is "line 2: did not find expected key"), so
// Locate looks for the shortest run of data's first lines that fails with
// the same error: its last line is the one the parser could not read.
func Locate(data []byte, err error) (int, string) {
	line, msg := Split(err)
	if len(data) > MaxLocate {
		return line, hint(data, line, msg)
	}
	// Whole lines, each with its newline: a prefix of k lines is data[:ends[k-1]].
	var ends []int
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	same := func(k int) bool {
		perr := parse(data[:ends[k-1]])
		return perr != nil && perr.Error() == err.Error()
	}
	// The first k lines fail with err from the line of the mistake on (the
	// parser stops at its first mistake, and the lines before it read the
	// same), and before it they read, or fail otherwise (a quote or a
	// bracket left open by the cut).
	lo, hi := 1, len(ends)
	if hi == 0 || !same(hi) {
		return line, hint(data, line, msg)
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if same(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, hint(data, lo, msg)
}

// indentMsgs are the parser's messages for a line indented wrongly (or a
// colon where a line cannot have one).
var indentMsgs = []string{
	"did not find expected key",
	"did not find expected '-' indicator",
	"mapping values are not allowed in this context",
	"block sequence entries are not allowed in this context",
	"could not find expected ':'",
	"did not find expected <document start>",
}

// hint returns msg, the mistake on line (from 1) of data, saying so when
// that line is indented with a tab, which YAML forbids (the parser says
// "found character that cannot start any token" or "a tab character that
// violates indentation"), or what to check when the parser's words are
// about indentation.
func hint(data []byte, line int, msg string) string {
	text := lineOf(data, line)
	if indent := text[:len(text)-len(strings.TrimLeft(text, " \t"))]; strings.Contains(indent, "\t") {
		return "invalid YAML: tabs are not allowed for indentation (this line is indented with one): indent with spaces"
	}
	for _, m := range indentMsgs {
		if strings.HasSuffix(msg, m) {
			return msg + ": check this line's indentation (spaces only; a key lines up with its mapping's other keys, a '-' with its list's other items)"
		}
	}
	return msg
}

// lineOf returns line n (from 1) of data, without its newline, or "".
func lineOf(data []byte, n int) string {
	for i := 1; n > 0 && len(data) > 0; i++ {
		l, rest, _ := bytes.Cut(data, []byte("\n"))
		if i == n {
			return string(l)
		}
		data = rest
	}
	return ""
}

// parse parses every YAML document of data into nodes and returns the
// first error, if any.
func parse(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
