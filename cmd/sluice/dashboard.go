package main

import (
	"errors"
	"net/http"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/sketch"
	"github.com/sluicehq/sluice/ui"
)

// observeFlags size the heavy hitters (GET /v1/top) and the denial log,
// and turn on the memory store's flood guard.
type observeFlags struct {
	denyLogRate float64
	topKeys     int
	topWidth    int
	floodGuard  bool
}

func (o *observeFlags) register(fs *ff.FlagSet) {
	fs.Float64Var(&o.denyLogRate, 0, "deny-log-rate", observe.DefaultConfig().DenialLogRate, withEnv("deny-log-rate", "most denials logged a second, each with domain, descriptor, limit and retry time (10); the next line logged counts those left out; negative logs none"))
	fs.IntVar(&o.topKeys, 0, "top-keys", observe.DefaultConfig().MaxKeys, withEnv("top-keys", "most domain and descriptor key pairs whose heavy hitters GET /v1/top counts (16: 6.5 MiB at most with --top-width 1024)"))
	fs.BoolVarDefault(&o.floodGuard, 0, "flood-guard", false, withEnv("flood-guard", "memory store: a client seen for the first time takes no entry until it is seen again (two Bloom filters, 4 MiB), so a flood of one-shot clients cannot push real ones out; costs at most one uncounted request per client a minute"))
	fs.IntVar(&o.topWidth, 0, "top-width", sketch.DefaultConfig().Width, withEnv("top-width", "counters per row of each count-min sketch: /v1/top's counts are at most e/width of a window's total too high, with 98% confidence (1024: 0.27%)"))
}

func (o *observeFlags) config() (observe.Config, error) {
	if o.topKeys < 1 || o.topKeys > observe.MaxMaxKeys {
		return observe.Config{}, usageError("--top-keys %d: want 1 to %d", o.topKeys, observe.MaxMaxKeys)
	}
	if o.topWidth < 1 || o.topWidth > sketch.MaxWidth {
		return observe.Config{}, usageError("--top-width %d: want 1 to %d", o.topWidth, sketch.MaxWidth)
	}
	cfg := observe.DefaultConfig()
	cfg.MaxKeys, cfg.Sketch.Width = o.topKeys, o.topWidth
	cfg.DenialLogRate = o.denyLogRate
	if o.denyLogRate == 0 {
		cfg.DenialLogRate = -1 // observe.Config's "none"; zero is its default
	}
	return cfg, nil
}

// reloadEvents is how many rules loads the dashboard lists.
const reloadEvents = 20

// handlerMux is where the dashboard's routes go: the HTTP API
// (*httpapi.Handler) and the ops listener (*httpapi.Ops).
type handlerMux interface {
	Handle(pattern string, h http.Handler) error
}

// mountDashboard mounts /ui, GET /v1/top and GET /v1/keys/ on each of hs.
func (co *core) mountDashboard(hs ...handlerMux) error {
	d, err := ui.New(ui.Config{
		Rules:    co.watcher.Current,
		Gatherer: co.reg,
		Mode:     func() string { return co.decider.Mode().String() },
		Observer: co.observer,
		Events:   co.events,
	})
	if err != nil {
		return err
	}
	keys := observe.KeysHandler(co.svc)
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.Handle("/ui", d), h.Handle("/ui/", d),
			h.Handle("GET /v1/top", co.observer.TopHandler()), h.Handle("GET /v1/keys/", keys))
	}
	return errors.Join(errs...)
}
