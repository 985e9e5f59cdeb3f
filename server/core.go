package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/stack"
	"github.com/sluicehq/sluice/tracing"
	"github.com/sluicehq/sluice/ui"
)

// reloadEvents is how many rules loads the dashboard lists.
const reloadEvents = 20

// core is what serve and proxy share: the metrics registry, the store, the
// rules source and the decision service with its observers.
type core struct {
	reg      *prometheus.Registry
	m        *metrics.Metrics
	rules    rulesSource // the files' watcher or the rules database's retriever
	rulesDB  control.DB  // what the admin API writes: the rules database, or control/filedb for a rules directory; nil for one file
	rulesM   *metrics.RulesSource
	svc      *decide.Service  // the decision service, watched by its observers (GET /v1/keys looks with Inspect, uncounted)
	observer *observe.Watcher // heavy hitters, denial log
	tracer   *tracing.Tracer  // spans of decisions and store calls; nil when tracing is off
	events   *ui.Events       // rules loads, for the dashboard
	stores   *stack.Stack     // the store, composed
	// unreachedOK: ready before the store has answered (--fail open, given
	// explicitly)
	unreachedOK bool
	// rulesReady, if not nil, says whether the rules source is ready: an
	// xDS server's first rules came.
	rulesReady func() error
	// envoyGRPC counts the gRPC calls under Envoy's names (with
	// Envoy.Metrics); nil: not counted.
	envoyGRPC *envoyGRPCStats
	closers   []func() error // in the order of opening; close calls them last first
}

// newCore opens the store, loads and watches the rules and makes the
// decision service, for c with its defaults set. The caller calls close
// when done; on error, newCore has closed what it opened.
func newCore(c Config) (_ *core, err error) {
	co := &core{reg: prometheus.NewRegistry(), events: ui.NewEvents(reloadEvents)}
	defer func() {
		if err != nil {
			err = errors.Join(err, co.close())
		}
	}()
	if err := co.openMetrics(c); err != nil {
		return nil, err
	}
	if err := co.openTracing(c); err != nil {
		return nil, err
	}
	if err := co.openStore(c); err != nil {
		return nil, err
	}
	if co.rulesM, err = metrics.NewRulesSource(co.reg, func() *rules.Set {
		if co.rules == nil {
			return nil
		}
		return co.rules.Current()
	}); err != nil {
		return nil, err
	}
	hooks := rulesHooks{m: co.m, rm: co.rulesM, onReload: func(set *rules.Set, err error) { co.events.Add(time.Now(), set, err) }}
	src, db, closeRules, err := openRules(c.Logger, c, co.stores.CheckLimit, hooks)
	if err != nil {
		return nil, err
	}
	co.rules, co.rulesDB = src, db
	co.closers = append(co.closers, closeRules)
	if sub, ok := src.(xdsSource); ok {
		co.rulesReady = xdsReady(sub.Subscription, c.Rules.XDS.StartWithoutRules)
	}
	c.Logger.Info("rules loaded", "rules", stack.Redact(c.Rules.Source), "version", src.Current().Version(), "domains", src.Current().Domains())
	warnRules(c.Logger, src.Current())
	if err := co.wireDecider(c); err != nil {
		return nil, err
	}
	return co, nil
}

// openMetrics makes the registry and sluice's metrics, with Envoy's when
// c asks (before the rules load, which they count), and starts statsd.
func (co *core) openMetrics(c Config) error {
	for _, col := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := co.reg.Register(col); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	m, err := metrics.New(co.reg)
	if err != nil {
		return err
	}
	co.m = m
	e := c.Envoy
	if err := checkStatsd(e); err != nil {
		return err
	}
	if e.Metrics {
		if err := m.EnvoyStats(co.reg, e.NearLimitRatio); err != nil {
			return configError("--near-limit-ratio: %v", err)
		}
		if co.envoyGRPC, err = newEnvoyGRPCStats(co.reg); err != nil {
			return err
		}
	}
	// The series named by request values take their part of --max-memory
	// (newMemory leaves it to them).
	m.SetDetailedBytes(metrics.DetailedShare(maxMemory(c)))
	if e.StatsdAddr != "" {
		co.closers = append(co.closers, startStatsd(m, e, c.Logger))
	}
	return nil
}

// openTracing makes the tracer c.Tracing asks for, if any.
func (co *core) openTracing(c Config) error {
	tp, stopTracing, err := newTracerProvider(c.Tracing)
	if err != nil || tp == nil {
		return err
	}
	co.closers = append(co.closers, stopTracing)
	co.tracer = tracing.NewTracer(tp)
	return nil
}

// openStore opens the store c names, its calls watched by the tracer, if
// any, and the metrics: the observe hook around its outermost layer.
func (co *core) openStore(c Config) error {
	var watchers []stack.Watcher
	if co.tracer != nil {
		watchers = append(watchers, co.tracer)
	}
	st, err := openStore(c, c.Logger, co.reg, append(watchers, co.m)...)
	if err != nil {
		return err
	}
	co.stores = st
	co.closers = append(co.closers, func() error { return closeStore(st) })
	return nil
}

// wireDecider makes the decision service over the store and the rules,
// with admit's concurrency slots after its rate decision, Envoy's global
// shadow mode (decide.Config.Shadow) and its observers, told of each
// decision in this order: unknown domains, the decision's span (which the
// tracer also starts, before the decision), the heavy hitters and denial
// log, and the decision metrics. It is the one place that knows them.
func (co *core) wireDecider(c Config) error {
	dc := decide.DefaultConfig()
	dc.Rules, dc.Store = co.rules.Current, co.stores
	dc.StoreTimeout, dc.Fail, dc.Logger, dc.Ping = c.StoreTimeout, c.Fail, c.Logger, co.stores.Ping
	dc.StoreHardTimeout = c.StoreHardTimeout
	dc.Servers, dc.WriteBack, dc.Restore = co.stores.Servers, co.stores.WriteBack, co.stores.RestoreCounts
	dc.EnvoyKeys, dc.Shadow, dc.Sync = c.Store.EnvoyKeys, c.Shadow, c.Store.Sync
	oc := observe.DefaultConfig()
	oc.MaxKeys, oc.Sketch.Width = c.Observe.TopKeys, c.Observe.TopWidth
	oc.DenialLogRate, oc.Logger = c.Observe.DenyLogRate, c.Logger
	var err error
	if co.observer, err = observe.New(oc); err != nil {
		return err
	}
	co.closers = append(co.closers, co.observer.Close)
	dc.Observers = append(dc.Observers, observe.NewUnknownDomains(c.Logger))
	if co.tracer != nil {
		dc.Observers = append(dc.Observers, co.tracer)
	}
	dc.Observers = append(dc.Observers, co.observer, co.m)
	ac := admit.DefaultConfig()
	ac.Fail, ac.Timeout, ac.Lease, ac.Logger = c.Fail, c.StoreTimeout, c.ConcurrencyLease, c.Logger
	if sl := co.stores.SlotCounter(); sl != nil { // Redis's, counted across servers; else admit's own
		ac.Slots = sl
	}
	if dc.Admit, err = admit.New(ac); err != nil {
		return fmt.Errorf("concurrency limits: %w", err)
	}
	if co.svc, err = decide.New(dc); err != nil {
		return fmt.Errorf("decision service: %w", err)
	}
	co.m.WatchMode(co.svc.Mode)
	if err := metrics.HeldDenials(co.reg, co.svc.HeldDenials); err != nil {
		return err
	}
	co.closers = append(co.closers, func() error {
		// The store calls still going on end, and the hits admitted
		// without the store go back to it, before the store closes.
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		return co.svc.Close(ctx)
	})
	co.unreachedOK = c.Fail == decide.FailOpen && c.FailExplicit
	co.startProbe(c.Logger)
	return nil
}

// closeTimeout bounds how long closing the decision service waits for the
// store calls still going on and writes back the hits admitted without the
// store.
const closeTimeout = 5 * time.Second

// probeEvery is how often the server pings a store it decides without
// (decide.Service.Probe), and checks whether it has reached it: four times
// a second, so that with the fail mode local's half second for every
// server to write back its hits, decisions are back on a store within a
// second of its return. A ping costs the store one PING.
const probeEvery = 250 * time.Millisecond

// unreachedWarnEvery is how often a server ready without its store (see
// Config.FailExplicit) says so.
const unreachedWarnEvery = time.Minute

// startProbe starts the goroutine that probes the store every probeEvery
// while decisions go without it, so that /readyz follows the store
// without traffic, and that says at Warn every unreachedWarnEvery that
// limits are off while a server ready without its store has not reached
// it. close stops it.
func (co *core) startProbe(log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(probeEvery)
		defer t.Stop()
		var warned time.Time
		for {
			if co.unreachedOK && !co.stores.Ready() && time.Since(warned) >= unreachedWarnEvery {
				log.Warn("store not reached: --fail open admits every request without its limits until it is", "fail_open_decisions", co.svc.FailDecisions()[decide.ModeOpen])
				warned = time.Now()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			co.svc.Probe(ctx) //nolint:errcheck // the store's own log says why it fails; Mode says that it does
		}
	}()
	co.closers = append(co.closers, func() error {
		cancel()
		<-done
		return nil
	})
}

// ready returns nil once the server may be sent decisions: once rules
// from an xDS server came (unless it starts without them), and as far as
// its store goes, once every Redis of it has answered, or at once with
// --fail open given explicitly; until then, why not.
func (co *core) ready() error {
	if co.rulesReady != nil {
		if err := co.rulesReady(); err != nil {
			return err
		}
	}
	if co.unreachedOK || co.stores.Ready() {
		return nil
	}
	return errors.New("store not reached yet: decisions follow --fail until it is (--fail open, given explicitly, serves without it)")
}

// failDecisions returns the decisions the store did not make since the
// server started, by the name of the mode that made them, every mode
// named.
func (co *core) failDecisions() map[string]uint64 {
	n := co.svc.FailDecisions()
	out := make(map[string]uint64, len(n)-1)
	for m := decide.ModeOpen; m <= decide.MaxMode; m++ {
		out[m.String()] = n[m]
	}
	return out
}

// mode returns the decision service's mode as /readyz and the dashboard
// name it.
func (co *core) mode() string { return co.svc.Mode().String() }

// close stops what newCore started, the last started first: the
// observers, tracing, the rules source, the store and statsd (which sends
// its last counts).
func (co *core) close() error {
	var err error
	for i := len(co.closers) - 1; i >= 0; i-- {
		err = errors.Join(err, co.closers[i]())
	}
	co.closers = nil
	return err
}
