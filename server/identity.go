package server

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/transport/forwardauth"
	"github.com/sluicehq/sluice/transport/respond"
)

// newIdentity reads the identity file at path, or, when path is empty,
// limits per client address in domain, and counts on reg the forwarding
// headers it does not believe. Its one-time warnings go to log.
func newIdentity(path, domain string, log *slog.Logger, reg prometheus.Registerer) (*identity.Identity, error) {
	cfg := identity.DefaultConfig()
	cfg.Domain = domain
	if path != "" {
		var err error
		if cfg, err = identity.Load(path); err != nil {
			return nil, fmt.Errorf("--identity: %w", err)
		}
	}
	id, err := identity.New(cfg, nil, identity.WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	return id, identityMetrics(reg, id)
}

// identityMetrics exposes on reg id's counts of the forwarding headers it
// did not believe, as sluice_forwarded_headers_ignored_total by reason.
func identityMetrics(reg prometheus.Registerer, id *identity.Identity) error {
	for _, c := range []struct {
		reason string
		count  func(identity.ForwardStats) uint64
	}{
		{"untrusted_peer", func(s identity.ForwardStats) uint64 { return s.Untrusted }},
		{"other_header", func(s identity.ForwardStats) uint64 { return s.OtherHeader }},
	} {
		cf := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_forwarded_headers_ignored_total",
			Help: "Requests whose X-Forwarded-For, Forwarded or X-Real-IP was not believed, by reason: " +
				"untrusted_peer (the peer is not in trusted_proxies: a proxy missing there, or a client's own header), " +
				"other_header (a trusted proxy sent another header than forwarded_header).",
			ConstLabels: prometheus.Labels{"reason": c.reason},
		}, func() float64 { return float64(c.count(id.ForwardStats())) })
		if err := reg.Register(cf); err != nil {
			return fmt.Errorf("register identity metrics: %w", err)
		}
	}
	return nil
}

// newForwardAuth returns the GET /v1/auth handler for nginx auth_request and
// Traefik ForwardAuth.
func newForwardAuth(identityPath string, rw *respond.Writer, d respond.Decider, log *slog.Logger, reg prometheus.Registerer) (*forwardauth.Handler, error) {
	id, err := newIdentity(identityPath, "", log, reg)
	if err != nil {
		return nil, err
	}
	h, err := forwardauth.New(forwardauth.Config{Identity: id, Decider: d, Respond: rw, Logger: log})
	if err != nil {
		return nil, configError("--identity %s: %v", identityPath, err)
	}
	return h, nil
}
