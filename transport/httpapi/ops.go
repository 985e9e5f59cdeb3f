package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/internal/httpjson"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/shed"
)

// OpsConfig configures the operational endpoints.
type OpsConfig struct {
	// Rules returns the rules in force, or nil until they are loaded.
	// Required.
	Rules func() *rules.Set
	// Mode says where decisions come from now (decide.Service's Mode:
	// "store", or a fail mode while the store is down), for /readyz. Nil
	// leaves it out.
	Mode func() string
	// Ready returns why the process must not be sent decisions yet
	// (a store it has never reached), nil when it may: /readyz answers 503
	// with the error as its reason while it is not nil. Nil: always ready.
	Ready func() error
	// FailDecisions returns how many decisions since start each fail mode
	// made (the store did not decide them), by the mode's name, which
	// /readyz shows under "fail_decisions"; nil leaves it out.
	FailDecisions func() map[string]uint64
	// Gatherer is the registry /metrics serves; nil leaves /metrics out.
	Gatherer prometheus.Gatherer
	// Shed returns the load shedder's state (the proxy's), which /readyz
	// shows under "shed"; nil leaves it out. A saturated upstream does
	// not make the process unready: shedding is its answer to that.
	Shed func() shed.Stats
	// Regions returns what /readyz shows under "regions": the regions
	// layer's state (store/regions), its peers, those it could not read
	// named; nil leaves it out. A peer unreachable does not make the
	// process unready: it decides without it.
	Regions func() any
}

// Ops serves the operational endpoints of a sluice process: the HTTP API
// mounts them, and so does an ops listener of their own (--ops-addr). It
// is safe for concurrent use.
//
//	GET /healthz      200 while the process serves
//	GET /readyz       200 once rules are loaded (and Ready), 503 before and while draining
//	GET /healthcheck  Envoy ratelimit's: 200 "OK" while ready, 500 otherwise
//	GET /metrics      Prometheus metrics of the Gatherer, if any
type Ops struct {
	cfg      OpsConfig
	mux      *http.ServeMux
	draining atomic.Bool
}

// NewOps returns the operational endpoints.
func NewOps(cfg OpsConfig) (*Ops, error) {
	if cfg.Rules == nil {
		return nil, errors.New("httpapi: OpsConfig.Rules is required")
	}
	o := &Ops{cfg: cfg, mux: http.NewServeMux()}
	o.mount(o.mux)
	return o, nil
}

// mount adds the endpoints to mux.
func (o *Ops) mount(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", o.healthz)
	mux.HandleFunc("GET /readyz", o.readyz)
	mux.HandleFunc("GET /healthcheck", o.healthcheck)
	if o.cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(o.cfg.Gatherer, promhttp.HandlerOpts{}))
	}
}

// Handle mounts handler at pattern beside the endpoints (pprof, say); see
// Handler.Handle.
func (o *Ops) Handle(pattern string, handler http.Handler) error {
	return handle(o.mux, pattern, handler)
}

// Drain makes /readyz answer 503 and /healthcheck 500, so that load
// balancers stop sending requests before the process shuts down. The
// other endpoints keep answering.
func (o *Ops) Drain() { o.draining.Store(true) }

// ServeHTTP implements http.Handler.
func (o *Ops) ServeHTTP(w http.ResponseWriter, r *http.Request) { o.mux.ServeHTTP(w, r) }

// handle mounts handler at pattern on mux, returning an error where
// ServeMux would panic: an invalid pattern, or one that conflicts with a
// route already mounted.
func handle(mux *http.ServeMux, pattern string, handler http.Handler) (err error) {
	if handler == nil {
		return fmt.Errorf("mount %q: nil handler", pattern)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mount %q: %v", pattern, r)
		}
	}()
	mux.Handle(pattern, handler)
	return nil
}

func (o *Ops) healthz(w http.ResponseWriter, _ *http.Request) {
	httpjson.Write(w, http.StatusOK, map[string]string{"status": "ok"})
}

// ready returns the readiness body and its status code.
func (o *Ops) ready() (int, map[string]any) {
	body := map[string]any{"status": "ready"}
	if o.cfg.Mode != nil {
		body["mode"] = o.cfg.Mode()
	}
	code := http.StatusOK
	set := o.cfg.Rules()
	switch {
	case o.draining.Load():
		code, body["status"] = http.StatusServiceUnavailable, "draining"
	case set == nil:
		code, body["status"], body["reason"] = http.StatusServiceUnavailable, "not ready", "rules not loaded"
	default:
		body["rules"] = set.Version()
		if o.cfg.Ready == nil {
			break
		}
		if err := o.cfg.Ready(); err != nil {
			code, body["status"], body["reason"] = http.StatusServiceUnavailable, "not ready", err.Error()
		}
	}
	if o.cfg.FailDecisions != nil {
		body["fail_decisions"] = o.cfg.FailDecisions()
	}
	if o.cfg.Regions != nil {
		body["regions"] = o.cfg.Regions()
	}
	if o.cfg.Shed != nil {
		st := o.cfg.Shed()
		shedBody := map[string]any{"limit": st.Limit, "in_flight": st.InFlight, "waiting": st.Waiting,
			"saturated": st.Saturated(), "min_rtt_ms": float64(st.MinRTT.Microseconds()) / 1000}
		shedded := map[string]uint64{}
		for p := shed.Sheddable; p <= shed.Critical; p++ {
			shedded[p.String()] = st.Shed[p]
		}
		shedBody["shed"] = shedded
		body["shed"] = shedBody
	}
	return code, body
}

// readyz answers {"status": "ready", "mode": ..., "rules": version} once
// rules are loaded, and 503 with the status "not ready" or "draining"
// otherwise.
func (o *Ops) readyz(w http.ResponseWriter, _ *http.Request) {
	code, body := o.ready()
	httpjson.Write(w, code, body)
}

// healthcheck answers as Envoy's ratelimit does, for probes written for
// it: 200 with the body "OK" when ready, 500 with no body otherwise.
func (o *Ops) healthcheck(w http.ResponseWriter, _ *http.Request) {
	if code, _ := o.ready(); code != http.StatusOK {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("OK")) //nolint:errcheck // the client went away; nothing to do
}
