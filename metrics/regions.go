package metrics

import (
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RegionStatus is what the regions layer's last round found
// (store/regions's Status), as Regions reads it at each scrape.
type RegionStatus struct {
	Region                            string // this server's region
	Regions                           int    // R, the regions alive or cut off, this one included
	Rounds, Failed, CutRounds, Unseen uint64 // rounds run, failed, cut off; decisions made without a cap
	Cut                               bool
	Unsettled                         bool // the last reading of this region's Redis may miss what its earlier incarnations counted
	Peers                             []RegionPeer
}

// RegionPeer is one peer region as the last round found it.
type RegionPeer struct {
	Name, State string        // State: live, unechoed, lagging, dead, unreachable, unknown, mismatch or refused
	LastRead    time.Time     // when the last round that read it began; zero if none did
	Errors      uint64        // reads that failed
	ReadTime    time.Duration // how long its last read that answered took
	Timeout     time.Duration // how long the last round waited for it at most
	Unsettled   bool          // its last reading may miss what its Redis's earlier incarnations counted
}

// Regions registers on reg the metrics of the regions layer, read from
// status at each scrape, now being the clock LastRead is on:
//
//	sluice_regions                                 the regions its caps divide by
//	sluice_region_rounds_total                     rounds run
//	sluice_region_rounds_failed_total              rounds whose home read or beat failed
//	sluice_region_rounds_cut_total                 rounds that found the server cut off
//	sluice_region_cut                              1 while the last round did
//	sluice_region_unseen_decisions_total           decisions made without a cap
//	sluice_region_peer_state{peer,state}           1 for the peer's state in the last round
//	sluice_region_peer_lag_seconds{peer}           age of the last reading of the peer (+Inf: none)
//	sluice_region_peer_last_sync_timestamp_seconds{peer}  when it was taken (0: never)
//	sluice_region_peer_errors_total{peer}          reads of the peer that failed
//	sluice_region_peer_read_seconds{peer}          how long its last read that answered took
//	sluice_region_peer_timeout_seconds{peer}       how long a round waits for it (3 × its reads, within bounds)
//	sluice_region_unsettled{region}                1 while the last reading of the region's Redis (this one's or a peer's) may miss what it counted before it came back empty
func Regions(reg prometheus.Registerer, status func() RegionStatus, now func() time.Time) error {
	if err := reg.Register(&regionCollector{status: status, now: now}); err != nil {
		return fmt.Errorf("register regions metrics: %w", err)
	}
	return nil
}

// peerStates are the states sluice_region_peer_state reports, 1 for the
// peer's and 0 for the others.
var peerStates = []string{"live", "unechoed", "lagging", "dead", "unreachable", "unknown", "mismatch", "refused"}

var (
	regionsDesc   = prometheus.NewDesc("sluice_regions", "Regions the caps of global limits divide by: this one and every peer alive or cut off.", nil, nil)
	roundsDesc    = prometheus.NewDesc("sluice_region_rounds_total", "Rounds run: a beat, the home counts, then every peer's.", nil, nil)
	failedDesc    = prometheus.NewDesc("sluice_region_rounds_failed_total", "Rounds whose read of the home Redis, or beat, failed.", nil, nil)
	cutRoundsDesc = prometheus.NewDesc("sluice_region_rounds_cut_total", "Rounds that found the server cut off from a peer.", nil, nil)
	cutDesc       = prometheus.NewDesc("sluice_region_cut", "1 while the last round found the server cut off from a peer: its region holds to its share.", nil, nil)
	unseenDesc    = prometheus.NewDesc("sluice_region_unseen_decisions_total", "Decisions of global limits made without a cap (a key no round had read, or a cap expired).", nil, nil)
	stateDesc     = prometheus.NewDesc("sluice_region_peer_state", "1 for the state the last round found the peer in.", []string{"peer", "state"}, nil)
	lagDesc       = prometheus.NewDesc("sluice_region_peer_lag_seconds", "How old the last reading of the peer's counts is (+Inf: none yet).", []string{"peer"}, nil)
	lastDesc      = prometheus.NewDesc("sluice_region_peer_last_sync_timestamp_seconds", "When the last round that read the peer began, in Unix seconds (0: never).", []string{"peer"}, nil)
	errorsDesc    = prometheus.NewDesc("sluice_region_peer_errors_total", "Reads of the peer's Redis that failed or timed out.", []string{"peer"}, nil)
	readDesc      = prometheus.NewDesc("sluice_region_peer_read_seconds", "How long the last read of the peer that answered took.", []string{"peer"}, nil)
	timeoutDesc   = prometheus.NewDesc("sluice_region_peer_timeout_seconds", "How long a round waits for the peer: three times its reads' average, within the configured bounds.", []string{"peer"}, nil)
	unsettledDesc = prometheus.NewDesc("sluice_region_unsettled", "1 while the last reading of the region's Redis (this one's or a peer's) may miss what it counted before it came back empty: its keys are charged the whole limit for it.", []string{"region"}, nil)
)

type regionCollector struct {
	status func() RegionStatus
	now    func() time.Time
}

func (c *regionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{regionsDesc, roundsDesc, failedDesc, cutRoundsDesc, cutDesc, unseenDesc, stateDesc, lagDesc, lastDesc, errorsDesc, readDesc, timeoutDesc, unsettledDesc} {
		ch <- d
	}
}

func (c *regionCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	ch <- prometheus.MustNewConstMetric(regionsDesc, prometheus.GaugeValue, float64(st.Regions))
	ch <- prometheus.MustNewConstMetric(roundsDesc, prometheus.CounterValue, float64(st.Rounds))
	ch <- prometheus.MustNewConstMetric(failedDesc, prometheus.CounterValue, float64(st.Failed))
	ch <- prometheus.MustNewConstMetric(cutRoundsDesc, prometheus.CounterValue, float64(st.CutRounds))
	ch <- prometheus.MustNewConstMetric(cutDesc, prometheus.GaugeValue, one(st.Cut))
	ch <- prometheus.MustNewConstMetric(unseenDesc, prometheus.CounterValue, float64(st.Unseen))
	ch <- prometheus.MustNewConstMetric(unsettledDesc, prometheus.GaugeValue, one(st.Unsettled), st.Region)
	now := c.now()
	for _, p := range st.Peers {
		for _, s := range peerStates {
			v := 0.0
			if s == p.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, p.Name, s)
		}
		lag, last := math.Inf(1), 0.0
		if !p.LastRead.IsZero() {
			lag, last = now.Sub(p.LastRead).Seconds(), float64(p.LastRead.UnixNano())/1e9
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, lag, p.Name)
		ch <- prometheus.MustNewConstMetric(lastDesc, prometheus.GaugeValue, last, p.Name)
		ch <- prometheus.MustNewConstMetric(errorsDesc, prometheus.CounterValue, float64(p.Errors), p.Name)
		ch <- prometheus.MustNewConstMetric(readDesc, prometheus.GaugeValue, p.ReadTime.Seconds(), p.Name)
		ch <- prometheus.MustNewConstMetric(timeoutDesc, prometheus.GaugeValue, p.Timeout.Seconds(), p.Name)
		ch <- prometheus.MustNewConstMetric(unsettledDesc, prometheus.GaugeValue, one(p.Unsettled), p.Name)
	}
}

// one returns 1 for true, 0 for false: a flag as a gauge.
func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
