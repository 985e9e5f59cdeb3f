package rules

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// Error is one mistake in a rules file, at a line of it.
type Error struct {
	File string
	Line int // 1-based; 0 when the mistake is the file's as a whole
	Msg  string
}

// Error returns "file:line: msg", or "file: msg" without a line.
func (e *Error) Error() string {
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
