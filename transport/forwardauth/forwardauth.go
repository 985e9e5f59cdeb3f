// Package forwardauth is sluice's forward-auth endpoint: an http.Handler
// for GET /v1/auth that nginx's auth_request, Traefik's ForwardAuth and
// Caddy's forward_auth call before they pass a request on. It rebuilds the
// original request from the headers the identity file names
// (identity.Identity.Original: nginx's X-Original-* or the X-Forwarded-*
// of Traefik and Caddy, never both), and takes on it the step every HTTP
// way in takes (respond.Guard): decide, and answer 200 or 429 with the rate
// limit fields.
//
// For nginx (forward_auth_headers X-Original) a decision (200 or 429) has
// no body: the auth_request subrequest reads only the status and headers,
// and nginx closes a kept-alive connection whose answer had a body it did
// not read, so a JSON body on each 429 would cost a new connection to
// sluice per denied request. A rarer answer (a 400 naming the cap a request
// broke, a 503 when failing closed) keeps its body. Traefik and Caddy pass
// a denial's body on to the client, so for X-Forwarded it stays.
package forwardauth

import (
	"errors"
	"net/http"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/transport/respond"
)

// Config configures a Handler: Identity and Decider are required;
// FailClosed answers 503 when the Decider fails, where by default the
// request is let through (200). See respond.GuardConfig. The Identity's
// trusted proxies must hold the address nginx or Traefik connects from, or
// X-Forwarded-For is not believed and every request counts as the proxy's,
// and it must name its forward_auth_headers.
type Config = respond.GuardConfig

// Handler answers forward-auth requests. It is safe for concurrent use.
type Handler struct {
	id       *identity.Identity
	guard    *respond.Guard
	bodyless bool // answers go without a body: nginx's auth_request
}

var _ http.Handler = (*Handler)(nil)

// New returns a Handler for cfg, or an error when Identity or Decider is
// missing or the identity names no forward_auth_headers.
func New(cfg Config) (*Handler, error) {
	g, err := respond.NewGuard("forwardauth", cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Identity.ForwardAuthHeaders() == "" {
		return nil, errors.New("forwardauth: the identity file names no forward_auth_headers: X-Original (nginx auth_request) or X-Forwarded (Traefik, Caddy)")
	}
	bodyless := cfg.Identity.ForwardAuthHeaders() == identity.ForwardAuthXOriginal
	return &Handler{id: cfg.Identity, guard: g, bodyless: bodyless}, nil
}

// ServeHTTP answers 200 when the original request may pass and 429 when it
// is over a limit, with the rate limit fields either way. It accepts any
// method: nginx's auth subrequest keeps the original request's method
// unless told `proxy_method GET`.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.bodyless {
		w = &headersOnly{ResponseWriter: w}
	}
	if _, pass := h.guard.Check(w, h.id.Original(r)); pass {
		w.WriteHeader(http.StatusOK)
	}
}

// headersOnly is a ResponseWriter that sends the status and header fields
// of a decision (200 or 429) without a body or a Content-Length announcing
// one. Any other answer, such as a 400 naming the cap a request broke,
// keeps its body: it is rare, and says what is wrong.
type headersOnly struct {
	http.ResponseWriter
	body bool // the status written was neither 200 nor 429
}

func (w *headersOnly) WriteHeader(code int) {
	w.body = code != http.StatusOK && code != http.StatusTooManyRequests
	if !w.body {
		delete(w.Header(), "Content-Length")
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *headersOnly) Write(p []byte) (int, error) {
	if w.body {
		return w.ResponseWriter.Write(p)
	}
	return len(p), nil
}

// Unwrap returns the ResponseWriter w wraps, for http.ResponseController.
func (w *headersOnly) Unwrap() http.ResponseWriter { return w.ResponseWriter }
