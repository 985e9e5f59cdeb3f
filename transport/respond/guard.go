package respond

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/shed"
)

// Decider decides a request; *decide.Service is one. It is the one
// declaration of what every way in needs from package decide.
type Decider interface {
	Decide(ctx context.Context, r *decide.Request) (*decide.Response, error)
}

// GuardConfig configures a Guard: it is the Config of the middleware and
// of forward-auth, and part of the proxy's. Identity and Decider are
// required; the other fields' zero values are their defaults.
type GuardConfig struct {
	// Identity turns requests into descriptors. Required.
	Identity *identity.Identity
	// Decider decides; *decide.Service is one. Required.
	Decider Decider
	// Respond writes the rate limit fields and 429s. Nil: New(Config{}),
	// every field and 1 s of jitter.
	Respond *Writer
	// FailClosed answers 503 when the Decider returns an error; by default
	// (false) the request goes on. The decision service applies its own
	// fail mode to store failures, so such errors are rare. A request the
	// decision service refuses as invalid (a value beyond its caps) is
	// answered 400 either way: its client chose the values.
	FailClosed bool
	// Logger receives Decider errors. Nil: slog.Default().
	Logger *slog.Logger
	// Shed is the load shedder in front of what Serve serves (the
	// middleware's handler, or the proxy's upstream): requests it sheds
	// get 503 with Retry-After, by their rules' priority, and elastic
	// limits let a client past its own limit only while it has room
	// (decide.Request.Spare). Nil: no shedding.
	Shed *shed.Gate
}

// Guard is the step every HTTP way in takes before it lets a request go
// on: descriptors from the request, a decision, and the answer when the
// request stops there. It is safe for concurrent use.
type Guard struct {
	id         *identity.Identity
	decider    Decider
	w          *Writer
	failClosed bool
	log        *slog.Logger
	msg        string
	shed       *shed.Gate
	spare      func() bool // shed.HasRoom, made once; nil without a shedder
}

// NewGuard returns a Guard for cfg, or an error when Identity or Decider is
// missing. name names the way in in log messages ("proxy", "forward-auth",
// "middleware").
func NewGuard(name string, cfg GuardConfig) (*Guard, error) {
	if cfg.Identity == nil || cfg.Decider == nil {
		return nil, fmt.Errorf("%s: identity and decider are required", name)
	}
	g := &Guard{id: cfg.Identity, decider: cfg.Decider, w: cfg.Respond, failClosed: cfg.FailClosed, log: cfg.Logger, msg: name + " decision failed", shed: cfg.Shed}
	if g.w == nil {
		g.w = New(Config{})
	}
	if g.shed != nil {
		g.spare = g.shed.HasRoom
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	return g, nil
}

// Writer returns the Writer the Guard answers with.
func (g *Guard) Writer() *Writer { return g.w }

// Check decides the request r describes and reports whether it goes on.
// When it does (pass), the rate limit fields of resp are set on w's
// headers, and resp is the decision: nil when r has no descriptor (no
// limit applies) or the Decider failed and the Guard fails open. When it
// does not, w has been answered (429; 400 when decide refused the request
// as invalid, such as a header beyond its caps, fail open or not; 503 when
// the Decider failed otherwise and the Guard fails closed) or the client
// is gone, and nothing more is to be written. r's context bounds the
// decision.
//
// A concurrency limit's slot taken by Check is held for decide's Lease:
// Check is for a way in that hears of no end of the request
// (forward-auth). Ways in that do hear of it use Hold or Serve.
func (g *Guard) Check(w http.ResponseWriter, r *http.Request) (resp *decide.Response, pass bool) {
	return g.check(w, r, false)
}

// Hold is Check for a caller that serves the request itself and calls
// resp.Done when the response ends, however it ends (a deferred call runs
// on a panic too): the request's concurrency slots are held until then.
// resp.Done is safe on a nil resp.
func (g *Guard) Hold(w http.ResponseWriter, r *http.Request) (resp *decide.Response, pass bool) {
	return g.check(w, r, true)
}

// Serve decides r as Hold does and, when it passes, serves it with next
// behind the load shedder (GuardConfig.Shed), releasing its concurrency
// slots when next returns or panics (the panic goes on), the client gone
// or not.
func (g *Guard) Serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	resp, pass := g.check(w, r, true)
	if !pass {
		return
	}
	if resp != nil {
		defer resp.Done(context.WithoutCancel(r.Context()))
	}
	g.w.Gated(g.shed, Priority(resp), w, r, next)
}

func (g *Guard) check(w http.ResponseWriter, r *http.Request, hold bool) (resp *decide.Response, pass bool) {
	ds := g.id.Descriptors(r)
	if len(ds) == 0 { // no limit applies: nothing to decide
		return nil, true
	}
	req := decide.Request{Domain: g.id.Domain(), Descriptors: ds, Hold: hold, Spare: g.spare}
	resp, err := g.decider.Decide(r.Context(), &req)
	if err != nil {
		if r.Context().Err() != nil {
			return nil, false // the client is gone: nobody to answer
		}
		if errors.Is(err, decide.ErrInvalidRequest) {
			// The client chose what made the request invalid (a header,
			// a claim or a path beyond decide's caps): failing open here
			// would let any client past every limit with one long value.
			writeRefusal(w, err)
			return nil, false
		}
		g.log.LogAttrs(r.Context(), slog.LevelWarn, g.msg, slog.String("error", err.Error()))
		if g.failClosed {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return nil, false
		}
		return nil, true
	}
	return resp, g.w.Write(w, resp)
}

// writeRefusal answers 400 with {"error": "request refused: <why>"}.
func writeRefusal(w http.ResponseWriter, err error) {
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{"request refused: " + err.Error()})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(append(body, '\n'))
}
