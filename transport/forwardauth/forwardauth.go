// Package forwardauth is sluice's forward-auth endpoint: an http.Handler
// for GET /v1/auth that nginx's auth_request, Traefik's ForwardAuth and
// Caddy's forward_auth call before they pass a request on. It rebuilds the
// original request from the headers the identity file names
// (identity.Identity.Original: nginx's X-Original-* or the X-Forwarded-*
// of Traefik and Caddy, never both), asks the decision service, and
// answers 200 or 429 with the rate limit fields.
package forwardauth

import (
	"context"
	"errors"
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

// Config configures a Handler.
type Config struct {
	// Identity turns the original request into descriptors. Its trusted
	// proxies must hold the address nginx or Traefik connects from, or
	// X-Forwarded-For is not believed and every request counts as the
	// proxy's. Required.
	Identity *identity.Identity
	// Decider decides. Required.
	Decider Decider
	// Respond writes the answer. Nil: respond.New(respond.DefaultConfig()).
	Respond *respond.Writer
	// FailClosed answers 503 when the Decider returns an error; by default
	// the request is let through (200). The decision service already
	// applies its own fail mode to store failures, so errors here are
	// rare: an unknown domain, a cancelled request.
	FailClosed bool
	// Logger receives Decider errors. Default slog.Default().
	Logger *slog.Logger
}

// Handler answers forward-auth requests. It is safe for concurrent use.
type Handler struct {
	id         *identity.Identity
	decider    Decider
	w          *respond.Writer
	failClosed bool
	log        *slog.Logger
}

var _ http.Handler = (*Handler)(nil)

// New returns a Handler for cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Identity == nil || cfg.Decider == nil {
		return nil, errors.New("forwardauth: Identity and Decider are required")
	}
	if cfg.Identity.ForwardAuthHeaders() == "" {
		return nil, errors.New("forwardauth: the identity file names no forward_auth_headers: X-Original (nginx auth_request) or X-Forwarded (Traefik, Caddy)")
	}
	h := &Handler{id: cfg.Identity, decider: cfg.Decider, w: cfg.Respond, failClosed: cfg.FailClosed, log: cfg.Logger}
	if h.w == nil {
		h.w = respond.New(respond.DefaultConfig())
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	return h, nil
}

// ServeHTTP answers 200 when the original request may pass and 429 when it
// is over a limit, with the rate limit fields either way. It accepts any
// method: nginx's auth subrequest keeps the original request's method
// unless told `proxy_method GET`.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	orig := h.id.Original(r)
	ds := h.id.Descriptors(orig)
	if len(ds) == 0 { // no limit applies: nothing to decide
		w.WriteHeader(http.StatusOK)
		return
	}
	req := decide.Request{Domain: h.id.Domain(), Descriptors: ds}
	resp, err := h.decider.Decide(r.Context(), &req)
	if err != nil {
		h.log.LogAttrs(r.Context(), slog.LevelWarn, "forward-auth decision failed", slog.String("error", err.Error()))
		if h.failClosed {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	if h.w.Write(w, resp) {
		w.WriteHeader(http.StatusOK)
	}
}
