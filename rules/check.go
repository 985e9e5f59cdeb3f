package rules

import (
	"fmt"

	"github.com/sluicehq/sluice"
)

// Check calls check on every limit of s and of its overrides, on the
// limit a store enforces (Limit.Enforced) and, when soft throttling makes
// that another, on the limit as stated (Limit.Limit), and returns the
// refusals as Errors, each "file:line: limit ...: why" (an override's at
// its overrides[i] path), ordered by file and line (at most 99 of them,
// then a line that says how many more); nil when check accepts them all.
// Unlimited and blocking limits, which no store takes, are not checked.
// check is typically a store's sluice.LimitChecker.CheckLimit, so that a
// rules set with a limit the store cannot apply is refused before it is
// put in force rather than failing on every decision; a nil check accepts
// everything.
func (s *Set) Check(check func(sluice.Limit) error) error {
	if s == nil || check == nil {
		return nil
	}
	var errs Errors
	n := 0
	// pos is the index of an override, -1 for a rule of the rules.
	refuse := func(r *Rule, pos int, l *Limit, msg string) {
		if n++; n < maxErrors {
			path := r.errPath
			if pos >= 0 {
				path = fmt.Sprintf("overrides[%d]", pos)
			}
			errs = append(errs, &Error{File: l.File, Line: l.Line, Path: path, Msg: msg})
		}
	}
	limits := func(r *Rule, pos int) {
		for _, l := range r.Limits {
			if l.Unlimited || l.Block {
				continue // never taken from a store
			}
			e := l.Enforced()
			if err := check(e); err != nil {
				msg := fmt.Sprintf("limit %s: %v", l.Limit, err)
				if e != l.Limit {
					msg = fmt.Sprintf("limit %s, enforced as %s by throttling: soft, exceed_percent: %d: %v", l.Limit, e, l.ExceedPercent, err)
				}
				refuse(r, pos, l, msg)
				continue
			}
			if e != l.Limit {
				if err := check(l.Limit); err != nil {
					refuse(r, pos, l, fmt.Sprintf("limit %s: %v", l.Limit, err))
				}
			}
		}
	}
	s.eachRule(func(r *Rule) { limits(r, -1) })
	for _, name := range s.names {
		if x := s.domains[name].overrides; x != nil {
			for i := range x.recs {
				limits(x.rules[x.recs[i].rule], int(x.recs[i].pos))
			}
		}
	}
	if n == 0 {
		return nil
	}
	errs.sort()
	if n >= maxErrors {
		errs = append(errs, &Error{File: errs[len(errs)-1].File,
			Msg: fmt.Sprintf("%d more limits refused; the rest are not shown", n-len(errs))})
	}
	return errs
}
