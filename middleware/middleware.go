// Package middleware limits the requests of a Go HTTP service that embeds
// sluice as a library: a func(http.Handler) http.Handler that turns each
// request into descriptors (package identity), asks a decision service
// (package decide, over a memory or Redis store) and answers 429 with the
// rate limit fields (package transport/respond) or calls the next handler
// with them set.
package middleware

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/transport/respond"
)

// Decider decides a request; *decide.Service is one.
type Decider interface {
	Decide(ctx context.Context, r *decide.Request) (*decide.Response, error)
}

// Config configures the middleware.
type Config struct {
	// Identity turns requests into descriptors. Required.
	Identity *identity.Identity
	// Decider decides. Required.
	Decider Decider
	// Respond writes the rate limit fields and 429s. Nil:
	// respond.New(respond.DefaultConfig()).
	Respond *respond.Writer
	// FailClosed answers 503 when the Decider returns an error; by default
	// the request goes on to the next handler. The decision service applies
	// its own fail mode to store failures, so such errors are rare.
	FailClosed bool
	// Logger receives Decider errors and a configuration without Identity
	// or Decider. Default slog.Default().
	Logger *slog.Logger
}

// New returns the middleware for cfg. Allowed requests reach next with the
// rate limit fields already set on the response; denied ones get 429. A
// Config without Identity or Decider cannot decide: its middleware logs
// that and answers every request 500, rather than let traffic through
// unlimited unnoticed.
func New(cfg Config) func(http.Handler) http.Handler {
	if cfg.Respond == nil {
		cfg.Respond = respond.New(respond.DefaultConfig())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return func(next http.Handler) http.Handler {
		if cfg.Identity == nil || cfg.Decider == nil {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				cfg.Logger.LogAttrs(r.Context(), slog.LevelError, "sluice middleware has no Identity or Decider")
				http.Error(w, "rate limiter misconfigured", http.StatusInternalServerError)
			})
		}
		return &handler{cfg: cfg, next: next}
	}
}

type handler struct {
	cfg  Config
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ds := h.cfg.Identity.Descriptors(r)
	if len(ds) == 0 { // no limit applies: nothing to decide
		h.next.ServeHTTP(w, r)
		return
	}
	req := decide.Request{Domain: h.cfg.Identity.Domain(), Descriptors: ds}
	resp, err := h.cfg.Decider.Decide(r.Context(), &req)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client is gone
		}
		h.cfg.Logger.LogAttrs(r.Context(), slog.LevelWarn, "rate limit decision failed", slog.String("error", err.Error()))
		if h.cfg.FailClosed {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		h.next.ServeHTTP(w, r)
		return
	}
	if h.cfg.Respond.Write(w, resp) {
		h.next.ServeHTTP(w, r)
	}
}
