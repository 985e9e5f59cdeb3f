// Package ui serves sluice's dashboard at /ui and its simulator at
// /ui/simulate, with every asset embedded in the binary (no network
// needed): decisions per second by domain and result, the clients most
// limited (from package observe's sketches), the store's mode and
// latency, the rules in force and the recent reloads. The charts are
// uPlot's (assets/uplot, its version and licence beside it).
//
// Routes:
//
//	GET  /ui/                 the dashboard
//	GET  /ui/simulate         the simulator
//	GET  /ui/static/...       the embedded scripts and styles
//	GET  /ui/api/stats        what the dashboard plots, as JSON
//	POST /ui/api/simulate     a simulation: {"rules": YAML, "traffic": SPEC, "algorithms": [...]}
//
// A simulation is capped (Config.Simulate, simulate.WebCaps: about 0.1 s
// of CPU and 9 MB a call at most) and one runs at a time (429 for
// another meanwhile). With Config.Authenticate every route asks for a
// token, as HTTP Basic's password (a browser prompts for it) or a bearer
// token; Guard puts other handlers behind the same.
package ui

import (
	"bytes"
	"cmp"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/httpjson"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/simulate"
)

//go:embed assets
var assets embed.FS

// Config configures the dashboard.
type Config struct {
	// Rules returns the rules in force, or nil before they load. Required.
	Rules func() *rules.Set
	// Gatherer is the registry of sluice's metrics, where the decisions
	// and the store's latency are read. Required.
	Gatherer prometheus.Gatherer
	// Mode says where decisions come from now (decide's Mode: store,
	// fail_open, fail_closed, local). Nil shows none.
	Mode func() string
	// Observer lists the keys the heavy hitters are counted under; nil
	// shows none.
	Observer *observe.Watcher
	// Events are the recent rules loads; nil shows none.
	Events *Events
	// Simulate caps what one simulation may ask for; zero fields mean
	// simulate.WebCaps'.
	Simulate simulate.Caps
	// Authenticate, if not nil, reports whether secret is a token that
	// may see the dashboard; every route then needs one (401 otherwise).
	// Nil: no authentication (the listener is the operator's guard).
	Authenticate func(secret string) bool
}

// MaxSimulateBody is the largest POST /ui/api/simulate body: 64 KiB (the
// rules in it cost about 50 bytes of parsing a byte).
const MaxSimulateBody = 64 << 10

// Handler serves the dashboard. It is safe for concurrent use.
type Handler struct {
	cfg  Config
	mux  *http.ServeMux
	busy chan struct{} // holds a simulation running
}

// DefaultConfig returns the default configuration: what every zero field
// of a Config means. Rules and Gatherer have none: they are required.
func DefaultConfig() Config {
	return Config{
		Simulate: simulate.WebCaps, // what one simulation may ask of a shared server
		// Mode, Observer, Events, Authenticate: nil, none shown or asked
	}
}

// New returns the dashboard's handler, to be mounted at /ui/.
func New(cfg Config) (*Handler, error) {
	if cfg.Rules == nil || cfg.Gatherer == nil {
		return nil, errors.New("ui: Rules and Gatherer are required")
	}
	w := DefaultConfig().Simulate
	pick := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	pick(&cfg.Simulate.Events, w.Events)
	pick(&cfg.Simulate.Keys, w.Keys)
	pick(&cfg.Simulate.Limits, w.Limits)
	if cfg.Simulate.Duration <= 0 {
		cfg.Simulate.Duration = w.Duration
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), busy: make(chan struct{}, 1)}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, fmt.Errorf("ui assets: %w", err)
	}
	h.mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /ui/{$}", page(static, "index.html"))
	h.mux.HandleFunc("GET /ui/simulate", page(static, "simulate.html"))
	h.mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	h.mux.HandleFunc("GET /ui/api/stats", h.stats)
	h.mux.HandleFunc("POST /ui/api/simulate", h.simulate)
	return h, nil
}

// ServeHTTP implements http.Handler. The pages may run only their own
// scripts and talk only to this server.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !h.allowed(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// Guard returns next behind the dashboard's authentication (none without
// Config.Authenticate): for the routes served beside it (GET /v1/top,
// GET /v1/keys/...), which show what it shows.
func (h *Handler) Guard(next http.Handler) http.Handler {
	if h.cfg.Authenticate == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.allowed(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// allowed reports whether r carries a token Authenticate accepts, as
// Basic's password or a Bearer token, and answers 401 if not.
func (h *Handler) allowed(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.Authenticate == nil {
		return true
	}
	secret := ""
	if _, pw, ok := r.BasicAuth(); ok {
		secret = pw
	} else if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		secret = strings.TrimSpace(tok)
	}
	if secret != "" && h.cfg.Authenticate(secret) {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="sluice dashboard", charset="UTF-8"`)
	httpjson.Error(w, http.StatusUnauthorized, "a token is required: an admin token as the password (any user name), or Authorization: Bearer TOKEN")
	return false
}

func page(static fs.FS, name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := fs.ReadFile(static, name)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(b) //nolint:errcheck // the client went away
	}
}

// Events keeps the last few rules loads for the dashboard. It is safe for
// concurrent use; the zero value keeps none, NewEvents some.
type Events struct {
	mu   sync.Mutex
	max  int
	list []Event
}

// Event is one rules load: when, whether it succeeded, the version and
// domains in force after it, and its error.
type Event struct {
	Time    time.Time `json:"time"`
	OK      bool      `json:"ok"`
	Version string    `json:"version,omitempty"`
	Domains []string  `json:"domains,omitempty"`
	Error   string    `json:"error,omitempty"`
	// Origin says where rules that are not files came from (an xDS
	// server, and the version it gave).
	Origin *rules.Origin `json:"origin,omitempty"`
}

// NewEvents keeps the last n events.
func NewEvents(n int) *Events { return &Events{max: n} }

// Add records a load at now: set is what loaded, or err why it failed.
func (e *Events) Add(now time.Time, set *rules.Set, err error) {
	ev := Event{Time: now, OK: err == nil}
	if err != nil {
		ev.Error = err.Error()
	} else if set != nil {
		ev.Version, ev.Domains, ev.Origin = set.Version(), set.Domains(), set.Origin()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.max <= 0 {
		return
	}
	if len(e.list) >= e.max {
		e.list = slices.Delete(e.list, 0, 1)
	}
	e.list = append(e.list, ev)
}

// List returns the events, newest first.
func (e *Events) List() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := slices.Clone(e.list)
	slices.Reverse(out)
	return out
}

type statsJSON struct {
	Time time.Time `json:"time"`
	Mode string    `json:"mode,omitempty"`
	// FailDecisions is sluice_fail_mode_decisions_total by mode: the
	// decisions the store did not make since the server started.
	FailDecisions map[string]float64 `json:"fail_decisions"`
	Decisions     []decisionCount    `json:"decisions"`
	Store         storeStats         `json:"store"`
	Rules         *rules.Set         `json:"rules"`
	Reloads       []Event            `json:"reloads"`
	Keys          []observe.Key      `json:"keys"`
	TopBytes      int                `json:"top_bytes"`
}

// decisionCount is sluice_decisions_total summed by domain and result.
type decisionCount struct {
	Domain string  `json:"domain"`
	Result string  `json:"result"`
	Total  float64 `json:"total"`
}

// storeStats is sluice_store_duration_seconds summed over operations: the
// dashboard plots the mean latency between two polls.
type storeStats struct {
	Calls      uint64  `json:"calls"`
	SumSeconds float64 `json:"sum_seconds"`
	Errors     float64 `json:"errors"`
}

func (h *Handler) stats(w http.ResponseWriter, _ *http.Request) {
	fams, err := h.cfg.Gatherer.Gather()
	if err != nil && len(fams) == 0 {
		httpjson.Error(w, http.StatusInternalServerError, "gather metrics: "+err.Error())
		return
	}
	st := statsJSON{Time: time.Now(), Rules: h.cfg.Rules(), Decisions: []decisionCount{}, Reloads: []Event{}, Keys: []observe.Key{}, FailDecisions: map[string]float64{}}
	if h.cfg.Mode != nil {
		st.Mode = h.cfg.Mode()
	}
	if h.cfg.Events != nil {
		st.Reloads = h.cfg.Events.List()
	}
	if o := h.cfg.Observer; o != nil {
		st.Keys, st.TopBytes = o.Keys(), o.Bytes()
	}
	sums := map[[2]string]float64{}
	for _, f := range fams {
		switch f.GetName() {
		case "sluice_decisions_total":
			for _, m := range f.GetMetric() {
				sums[[2]string{label(m, "domain"), label(m, "result")}] += m.GetCounter().GetValue()
			}
		case "sluice_store_duration_seconds":
			for _, m := range f.GetMetric() {
				st.Store.Calls += m.GetHistogram().GetSampleCount()
				st.Store.SumSeconds += m.GetHistogram().GetSampleSum()
			}
		case "sluice_store_errors_total":
			for _, m := range f.GetMetric() {
				st.Store.Errors += m.GetCounter().GetValue()
			}
		case "sluice_fail_mode_decisions_total":
			for _, m := range f.GetMetric() {
				st.FailDecisions[label(m, "mode")] += m.GetCounter().GetValue()
			}
		}
	}
	for k, v := range sums {
		st.Decisions = append(st.Decisions, decisionCount{Domain: k[0], Result: k[1], Total: v})
	}
	slices.SortFunc(st.Decisions, func(a, b decisionCount) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Result, b.Result))
	})
	writeJSON(w, st)
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// simulateRequest is the body of POST /ui/api/simulate.
type simulateRequest struct {
	Rules      string   `json:"rules"`
	Traffic    string   `json:"traffic"`
	Algorithms []string `json:"algorithms"`
}

// simulate runs one simulation at a time: another asked for meanwhile is
// answered 429.
func (h *Handler) simulate(w http.ResponseWriter, r *http.Request) {
	select {
	case h.busy <- struct{}{}:
		defer func() { <-h.busy }()
	default:
		w.Header().Set("Retry-After", "1")
		httpjson.Error(w, http.StatusTooManyRequests, "a simulation is running: one at a time; try again in a second")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxSimulateBody))
	if err != nil {
		httpjson.Error(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body: %v (at most %d bytes)", err, MaxSimulateBody))
		return
	}
	var req simulateRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpjson.Error(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	res, err := simulateWith(h.cfg.Simulate, req.Rules, req.Traffic, req.Algorithms)
	if err != nil {
		httpjson.Error(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, res)
}

// Simulate parses rulesYAML (a rules file), the traffic spec (see
// simulate.ParseTraffic) and the names of algorithms to compare, and runs
// the simulation within simulate.DefaultCaps: what POST /ui/api/simulate
// does within its own caps.
func Simulate(rulesYAML, traffic string, algorithms []string) (simulate.Result, error) {
	return simulateWith(simulate.DefaultCaps, rulesYAML, traffic, algorithms)
}

func simulateWith(c simulate.Caps, rulesYAML, traffic string, algorithms []string) (simulate.Result, error) {
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		return simulate.Result{}, fmt.Errorf("rules: %w", err)
	}
	p, err := c.ParseTraffic(traffic)
	if err != nil {
		return simulate.Result{}, err
	}
	return runWith(c, set, p, algorithms)
}

// Run simulates p against set's limits and the algorithms named, within
// simulate.DefaultCaps: what `sluice simulate` does.
func Run(set *rules.Set, p simulate.Pattern, algorithms []string) (simulate.Result, error) {
	return runWith(simulate.DefaultCaps, set, p, algorithms)
}

func runWith(c simulate.Caps, set *rules.Set, p simulate.Pattern, algorithms []string) (simulate.Result, error) {
	if len(algorithms) > 8 {
		return simulate.Result{}, errors.New("at most 8 algorithms")
	}
	var algs []sluice.Algorithm
	for _, a := range algorithms {
		alg, err := sluice.ParseAlgorithm(strings.TrimSpace(a))
		if err != nil {
			return simulate.Result{}, fmt.Errorf("algorithm: %w", err)
		}
		algs = append(algs, alg)
	}
	ts, err := c.Targets(set, algs...)
	if err != nil {
		return simulate.Result{}, err
	}
	return simulate.Run(p, ts), nil
}

// reportTemplate is the self-contained HTML report of `sluice simulate`:
// uPlot and the data inline.
var reportTemplate = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sluice simulate</title>
<style>{{.CSS}}
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:1em}
.card{border:1px solid #ddd;border-radius:6px;padding:.5em}
h2{font-size:1em;margin:.2em 0}
.note{color:#555;font-size:.9em}</style>
<script>{{.JS}}</script></head><body>
<h1>sluice simulate</h1>
<p class="note">Traffic: <code>{{.Traffic}}</code> ({{.Result.Requests}} requests over {{.Result.Seconds}} s), each limit with sluice's own algorithm on a simulated clock: admitted and denied stacked, on the traffic's scale, for each limit the traffic reached.</p>
<div class="grid" id="charts"></div>
<script>
const res = {{.Result}};
renderSimulation(document.getElementById("charts"), res);
</script>
</body></html>
`))

// WriteReport writes the self-contained HTML report of res (for
// `sluice simulate`): a chart for each limit the traffic reached, admitted
// and denied stacked on the traffic's scale, and the others listed; uPlot
// inline.
func WriteReport(w io.Writer, traffic string, res simulate.Result) error {
	js, err1 := assets.ReadFile("assets/uplot/uPlot.iife.min.js")
	css, err2 := assets.ReadFile("assets/uplot/uPlot.min.css")
	render, err3 := assets.ReadFile("assets/simchart.js")
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("report assets: %w", err)
	}
	return reportTemplate.Execute(w, map[string]any{
		"CSS":     template.CSS(css),
		"JS":      template.JS(string(js) + "\n" + string(render)),
		"Traffic": traffic,
		"Result":  res,
	})
}

// writeJSON answers v as JSON that no cache keeps: the figures change
// with every request.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Cache-Control", "no-store")
	httpjson.Write(w, http.StatusOK, v)
}
