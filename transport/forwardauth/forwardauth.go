// Package forwardauth is sluice's forward-auth endpoint: an http.Handler
// for GET /v1/auth that nginx's auth_request and Traefik's ForwardAuth call
// before they pass a request on. It rebuilds the original request from the
// headers the proxy sends (X-Original-URI or X-Forwarded-Uri,
// X-Original-Method or X-Forwarded-Method, X-Forwarded-Host,
// X-Forwarded-Proto, X-Forwarded-For and the original headers), asks the
// decision service, and answers 200 or 429 with the rate limit fields.
package forwardauth

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

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
	orig := Original(r)
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

// Original returns the request a forward-auth call r is about, rebuilt
// from the proxy's headers: the method from X-Original-Method or
// X-Forwarded-Method, the URI from X-Original-URI or X-Forwarded-Uri, the
// host from X-Forwarded-Host and the scheme from X-Forwarded-Proto. Fields
// with no header keep r's values (method GET, path /); headers and the peer
// address are r's, so X-Forwarded-For is judged against the trusted
// proxies as for any request. r is not modified.
func Original(r *http.Request) *http.Request {
	o := r.WithContext(r.Context())
	o.Method = http.MethodGet
	if m := first(r.Header, "X-Original-Method", "X-Forwarded-Method"); m != "" {
		o.Method = strings.ToUpper(m)
	}
	u := &url.URL{Path: "/"}
	if raw := first(r.Header, "X-Original-Uri", "X-Forwarded-Uri"); raw != "" {
		u = parseURI(raw)
	}
	o.Host = r.Host
	if host := first(r.Header, "X-Forwarded-Host"); host != "" {
		o.Host = host
	}
	u.Host = o.Host
	u.Scheme = "http"
	if p := first(r.Header, "X-Forwarded-Proto"); p == "https" || p == "http" {
		u.Scheme = p
	}
	o.URL = u
	o.RequestURI = u.RequestURI()
	return o
}

// parseURI reads a request target; an unreadable one keeps its path part,
// so that a path limit still sees it.
func parseURI(raw string) *url.URL {
	if u, err := url.ParseRequestURI(raw); err == nil {
		return &url.URL{Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}
	}
	p, q, _ := strings.Cut(raw, "?")
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return &url.URL{Path: p, RawQuery: q}
}

func first(h http.Header, names ...string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}
