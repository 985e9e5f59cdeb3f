// Package middleware limits the requests of a Go HTTP service that embeds
// sluice as a library: a func(http.Handler) http.Handler that turns each
// request into descriptors (package identity), asks a decision service
// (package decide, over a memory or Redis store) and answers 429 with the
// rate limit fields, or calls the next handler with them set. It is
// respond.Guard, the step the forward-auth endpoint and the reverse proxy
// take too, in front of a handler.
package middleware

import (
	"net/http"

	"github.com/sluicehq/sluice/transport/respond"
)

// Config configures the middleware: Identity and Decider are required;
// FailClosed answers 503 when the Decider fails, where by default the
// request goes on to the next handler. See respond.GuardConfig.
type Config = respond.GuardConfig

// New returns the middleware for cfg, or an error when Identity or Decider
// is missing. Allowed requests reach next with the rate limit fields
// already set on the response; denied ones get 429 and never reach it.
// A request holds its concurrency slots (a rule's `concurrency`) until next
// returns, or panics.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	g, err := respond.NewGuard("middleware", cfg)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g.Serve(w, r, next)
		})
	}, nil
}
