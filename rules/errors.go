package rules

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// Error is one mistake in rules: at a line of a rules file, or, in rules
// given as Go values (NewSet), at a path.
type Error struct {
	File string // "" for Go values
	Line int    // 1-based; 0 when the mistake is the file's as a whole, or there is no file
	// Path places the mistake by what it is in: the domain, then each
	// descriptor down to it as key or key=value, then rate_limit or
	// rate_limits[i], joined by /: "api/user/path=/login/rate_limits[1]".
	// Set for every mistake the schema finds, whether from a file or from
	// Go values; empty for mistakes of the YAML itself.
	Path string
	Msg  string
}

// Error returns "file:line: msg", or "file: msg" without a line, or
// "path: msg" without a file.
func (e *Error) Error() string {
	if e.File == "" {
		if e.Path == "" {
			return e.Msg
		}
		return e.Path + ": " + e.Msg
	}
	if e.Line <= 0 {
		return e.File + ": " + e.Msg
	}
	return e.File + ":" + strconv.Itoa(e.Line) + ": " + e.Msg
}

// Errors are all the mistakes found in a set of rules files, ordered by
// file and line. Load returns them all at once rather than the first.
type Errors []*Error

// Error returns one mistake per line.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns the mistakes, so that errors.As finds an *Error.
func (es Errors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}

// sort orders the mistakes by file, then line, keeping the order in which
// they were found otherwise.
func (es Errors) sort() {
	slices.SortStableFunc(es, func(a, b *Error) int {
		return cmp.Or(strings.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line))
	})
}
