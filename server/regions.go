package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store/stack"
)

// This file shows the regions layer (--region): its metrics, its part of
// /readyz, and a global limit's counts by region in GET /v1/keys.

// regionsMetrics registers on reg the regions layer's metrics, if st has
// one.
func regionsMetrics(st *stack.Stack, reg prometheus.Registerer) error {
	if st == nil || st.Regions() == nil {
		return nil
	}
	r := st.Regions()
	return metrics.Regions(reg, func() metrics.RegionStatus {
		s := r.Status()
		out := metrics.RegionStatus{Region: s.Region, Regions: s.Regions, Rounds: s.Rounds, Failed: s.Failed, CutRounds: s.CutRounds,
			Unseen: s.Unseen, Cut: s.Cut, Unsettled: s.Unsettled}
		for _, p := range s.Peers {
			out.Peers = append(out.Peers, metrics.RegionPeer{Name: p.Name, State: p.State.String(), LastRead: p.LastRead, Errors: p.Errors,
				ReadTime: p.ReadTime, Timeout: p.Timeout, Unsettled: p.Unsettled})
		}
		return out
	}, time.Now)
}

// regionsReady is what /readyz shows under "regions": this server's
// region, whether it is cut off, each peer's state and the age of its
// last reading, whether a region's Redis came back empty and is charged
// the whole limit until its servers carry what they knew (unsettled),
// and the peers it could not read last round by name. A
// peer unreachable leaves the server ready: it decides, each region
// holding to its share.
type regionsReady struct {
	Region      string      `json:"region"`
	Cut         bool        `json:"cut"`
	Unsettled   bool        `json:"unsettled,omitempty"`
	Peers       []peerReady `json:"peers"`
	Unreachable []string    `json:"unreachable,omitempty"`
}

type peerReady struct {
	Name      string  `json:"name"`
	State     string  `json:"state"`
	LagMS     float64 `json:"lag_ms,omitempty"`
	ReadMS    float64 `json:"read_ms,omitempty"`
	TimeoutMS float64 `json:"timeout_ms,omitempty"`
	Error     string  `json:"error,omitempty"`
	Unsettled bool    `json:"unsettled,omitempty"`
}

// readyRegions returns the function /readyz shows the regions layer of
// st with, or nil when it has none.
func readyRegions(st *stack.Stack) func() any {
	if st == nil || st.Regions() == nil {
		return nil
	}
	r := st.Regions()
	return func() any {
		s := r.Status()
		out := regionsReady{Region: s.Region, Cut: s.Cut, Unsettled: s.Unsettled, Peers: []peerReady{}}
		for _, p := range s.Peers {
			pr := peerReady{Name: p.Name, State: p.State.String(), ReadMS: ms(p.ReadTime), TimeoutMS: ms(p.Timeout),
				Unsettled: p.Unsettled}
			if !p.LastRead.IsZero() {
				pr.LagMS = float64(time.Since(p.LastRead).Microseconds()) / 1000
			}
			if p.Err != nil {
				pr.Error = p.Err.Error()
			}
			if p.State == stack.PeerUnreachable {
				out.Unreachable = append(out.Unreachable, p.Name)
			}
			out.Peers = append(out.Peers, pr)
		}
		return out
	}
}

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// regionCounts is the decision service as GET /v1/keys asks it, with the
// regions layer's counts of global limits (observe.RegionCounter).
type regionCounts struct {
	*decide.Service
	regions stack.Regions
}

// inspector returns what GET /v1/keys asks: svc, with st's counts by
// region when it has a regions layer.
func inspector(svc *decide.Service, st *stack.Stack) observe.Inspector {
	if st != nil && st.Regions() != nil {
		return regionCounts{svc, st.Regions()}
	}
	return svc
}

func (rc regionCounts) RegionCounts(key string) ([]observe.RegionCount, bool) {
	u, ok := rc.regions.Usage(key)
	if !ok {
		return nil, false
	}
	out := make([]observe.RegionCount, len(u.Regions))
	for i, r := range u.Regions {
		out[i] = observe.RegionCount{Region: r.Region, Count: r.Count, Charged: r.Charged}
	}
	if len(out) > 0 {
		out[0].Cap = u.Cap
	}
	return out, true
}
