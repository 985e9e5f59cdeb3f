package observe

import (
	"context"
	"log/slog"
	"sync"

	"github.com/sluicehq/sluice/decide"
)

// MaxUnknownDomains is the most domains an UnknownDomains remembers (each
// at most decide's cap on a domain, 4 KiB: 4 MiB in all); past it, it logs
// that it stops and logs no more.
const MaxUnknownDomains = 1024

// UnknownDomains is a decide.Observer that logs, at level Warn, the first
// request for each domain that no rules define: such a request passes
// unlimited, so a domain misspelt in Envoy's rate limit filter or in an
// identity file switches its limits off, and the metric
// sluice_unknown_domain_requests_total does not say which domain it was.
// Each domain is logged once in the process's life. It is safe for
// concurrent use; the zero value is not: use NewUnknownDomains.
type UnknownDomains struct {
	log  *slog.Logger
	mu   sync.RWMutex
	seen map[string]struct{} // domains logged; at most MaxUnknownDomains
	full bool                // the last line, "no more", is logged
}

var _ decide.Observer = (*UnknownDomains)(nil)

// NewUnknownDomains returns an UnknownDomains that logs to log
// (slog.Default() when nil).
func NewUnknownDomains(log *slog.Logger) *UnknownDomains {
	if log == nil {
		log = slog.Default()
	}
	return &UnknownDomains{log: log, seen: map[string]struct{}{}}
}

// Observe logs the request's domain if no rules define it and it is not
// logged yet.
func (u *UnknownDomains) Observe(ctx context.Context, r *decide.Request, resp *decide.Response, err error) {
	if err != nil || resp == nil || !resp.UnknownDomain {
		return
	}
	u.mu.RLock()
	_, seen := u.seen[r.Domain]
	full := u.full
	u.mu.RUnlock()
	if seen || full {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, seen := u.seen[r.Domain]; seen || u.full {
		return
	}
	if len(u.seen) == MaxUnknownDomains {
		u.full = true
		u.log.LogAttrs(ctx, slog.LevelWarn, "more unknown domains: no more are logged",
			slog.Int("logged", MaxUnknownDomains))
		return
	}
	u.seen[r.Domain] = struct{}{}
	u.log.LogAttrs(ctx, slog.LevelWarn, "unknown domain: no rules define it, so its requests pass unlimited (logged once)",
		slog.String("domain", r.Domain))
}
