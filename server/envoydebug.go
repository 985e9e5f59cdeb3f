package server

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/rules"
)

// mountEnvoyDebug serves on h what Envoy ratelimit's debug port serves
// beside its profiles: GET /rlconfig, the rules in force as Envoy's prints
// them (rlconfig), and, when m counts Envoy's counters (--envoy-metrics),
// GET /stats, each of them by its statsd name with its total, a "name:
// value" line each, as Envoy's prints its stats; and GET /, the list of
// them, /debug/pprof/ too when pprof says the profiles are served.
func mountEnvoyDebug(h handlerMux, set func() *rules.Set, m *metrics.Metrics, stats, pprof bool) error {
	// GET / lists the endpoints as Envoy's debug port lists them, with its
	// words: "PATH: what it is", sorted.
	list := []string{"/rlconfig: print out the currently loaded configuration for debugging"}
	if stats {
		list = append(list, "/stats: print out stats")
	}
	if pprof {
		list = append(list, "/debug/pprof/: root of various pprof endpoints. hit for help.",
			"/debug/pprof/profile: CPU profiling endpoint", "/debug/pprof/trace: trace endpoint")
	}
	slices.Sort(list)
	index := strings.Join(list, "\n") + "\n"
	if err := h.Handle("GET /{$}", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, index) //nolint:errcheck // the client went away
	})); err != nil {
		return err
	}
	if err := h.Handle("GET /rlconfig", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		rlconfig(w, set())
	})); err != nil || !stats {
		return err
	}
	return h.Handle("GET /stats", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		var b strings.Builder
		m.EnvoyTotals(func(name string, total uint64) { fmt.Fprintf(&b, "%s: %d\n", name, total) })
		io.WriteString(w, b.String()) //nolint:errcheck // the client went away
	}))
}

// envoyUnits are Envoy's names of the rules' units (its protobuf's).
var envoyUnits = map[string]string{"second": "SECOND", "minute": "MINUTE", "hour": "HOUR", "day": "DAY",
	"week": "WEEK", "month": "MONTH", "year": "YEAR"}

// rlconfig writes set as Envoy's ratelimit writes its configuration at
// /rlconfig: a line for each limit, domain by domain (sorted) and
// descriptor by descriptor in file order, "FULL_KEY: unit=UNIT
// requests_per_unit=N, shadow_mode: BOOL, quota_mode: BOOL", an unlimited
// one with unit UNKNOWN and 0, as Envoy's; sluice's own settings of a
// limit (several limits of a descriptor are a line each) follow, so that
// a limit Envoy's format states reads as Envoy's would. Rules from an xDS
// server end with a line "# rules from SOURCE, version V acknowledged".
func rlconfig(w io.Writer, set *rules.Set) {
	if set == nil {
		return
	}
	var b strings.Builder
	var walk func(rs []*rules.Rule)
	walk = func(rs []*rules.Rule) {
		for _, r := range rs {
			for _, l := range r.Limits {
				unit, n := "UNKNOWN", int64(0)
				if !l.Unlimited {
					unit, n = envoyUnits[l.Unit], l.Limit.Rate
					if l.Block {
						n = 0
					}
				}
				fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t", r.Path, unit, n, r.ShadowMode, r.QuotaMode)
				if l.UnitMultiplier > 1 {
					fmt.Fprintf(&b, ", unit_multiplier: %d", l.UnitMultiplier)
				}
				if !l.Unlimited && l.Limit.Algorithm != sluice.FixedWindow {
					fmt.Fprintf(&b, ", algorithm: %s", l.Limit.Algorithm)
					if l.Limit.Burst > 0 {
						fmt.Fprintf(&b, ", burst: %d", l.Limit.Burst)
					}
				}
				if l.Throttling != rules.Hard {
					fmt.Fprintf(&b, ", throttling: %s", l.Throttling)
				}
				b.WriteByte('\n')
			}
			if r.Concurrency > 0 {
				fmt.Fprintf(&b, "%s: concurrency=%d\n", r.Path, r.Concurrency)
			}
			walk(r.Descriptors)
		}
	}
	for _, d := range set.Domains() {
		walk(set.Rules(d))
	}
	if o := set.Origin(); o != nil { // sluice's: where rules that are not files came from
		fmt.Fprintf(&b, "# rules from %s, version %s acknowledged\n", o.Source, o.Version)
	}
	io.WriteString(w, b.String()) //nolint:errcheck // the client went away
}
