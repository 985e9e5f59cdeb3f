package observe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/httpjson"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/sketch"
)

// MaxTop is the most clients GET /v1/top lists (its n).
const MaxTop = 100

// MaxKeyEntries is the most key/value pairs a GET /v1/keys path holds.
const MaxKeyEntries = 8

// topJSON is the body of GET /v1/top.
type topJSON struct {
	Domain     string    `json:"domain"`
	Key        string    `json:"key"`
	By         string    `json:"by"`
	Window     string    `json:"window"`
	Counted    bool      `json:"counted"` // false: no descriptor of the domain with the key matched a rule yet
	Span       string    `json:"span,omitempty"`
	Total      uint64    `json:"total"`
	ErrorBound uint64    `json:"error_bound"`
	Confidence float64   `json:"confidence"`
	Clients    []hitJSON `json:"clients"`
	Keys       []Key     `json:"keys,omitempty"` // with counted false, the pairs counted
}

type hitJSON struct {
	Value     string `json:"value"`
	Count     uint64 `json:"count"`
	Truncated bool   `json:"truncated,omitempty"`
	// Rule and Descriptor are, for a client denied lately with a
	// descriptor of several entries, the rule that denied it last and the
	// whole descriptor (user=alice and path=/login), which GET /v1/keys
	// looks up; absent when the key and value say it all (one entry), or
	// when not remembered (a value another took the place of, a long
	// descriptor).
	Rule       string         `json:"rule,omitempty"`
	Descriptor []decide.Entry `json:"descriptor,omitempty"`
}

// TopHandler serves GET /v1/top?domain=D&key=K&by=requests|denied&window=1m|1h&n=N:
// the N (default 10, at most MaxTop) clients with the most requests or
// denials (default denied) in the window (default 1m), with the sketch's
// error bound. Without domain and key it lists the pairs counted.
func (o *Watcher) TopHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		t := topJSON{Domain: q.Get("domain"), Key: q.Get("key"), By: cmp.Or(q.Get("by"), "denied"),
			Window: cmp.Or(q.Get("window"), "1m"), Clients: []hitJSON{}}
		for k := range q {
			if !slices.Contains([]string{"domain", "key", "by", "window", "n"}, k) {
				httpjson.Error(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q: want domain, key, by, window, n", k))
				return
			}
		}
		n := 10
		if s := q.Get("n"); s != "" {
			var err error
			if n, err = strconv.Atoi(s); err != nil || n < 1 || n > MaxTop {
				httpjson.Error(w, http.StatusBadRequest, fmt.Sprintf("n %q: want 1 to %d", s, MaxTop))
				return
			}
		}
		var win time.Duration
		switch t.Window {
		case "1m":
			win = sketch.Minute
		case "1h":
			win = sketch.Hour
		default:
			httpjson.Error(w, http.StatusBadRequest, fmt.Sprintf("window %q: want 1m or 1h", t.Window))
			return
		}
		if t.By != "denied" && t.By != "requests" {
			httpjson.Error(w, http.StatusBadRequest, fmt.Sprintf("by %q: want requests or denied", t.By))
			return
		}
		if (t.Domain == "") != (t.Key == "") {
			httpjson.Error(w, http.StatusBadRequest, "domain and key go together")
			return
		}
		top, ok, err := o.Top(t.Domain, t.Key, t.By == "denied", win, n)
		if err != nil {
			httpjson.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		t.Counted = ok
		if !ok {
			t.Keys = o.Keys()
		} else {
			t.Span, t.Total, t.ErrorBound, t.Confidence = top.Span.String(), top.Total, top.ErrorBound, top.Confidence
			for _, h := range top.Hits {
				hj := hitJSON{Value: h.Value, Count: h.Count, Truncated: h.Truncated}
				if d := o.lastDenial(t.Domain, t.Key, h.Value); d != nil && !h.Truncated {
					hj.Rule, hj.Descriptor = d.rule, unpack(d.entries)
				}
				t.Clients = append(t.Clients, hj)
			}
		}
		writeJSON(w, http.StatusOK, t)
	})
}

// keyJSON is the body of GET /v1/keys.
type keyJSON struct {
	Domain        string       `json:"domain"`
	UnknownDomain bool         `json:"unknown_domain,omitempty"`
	Descriptors   []statusJSON `json:"descriptors"`
}

// statusJSON is one descriptor: its binding limit (the one a request's
// status would name: denying, or else with the least remaining) at the
// top, as Decide reports it, and every limit of its rule under limits.
type statusJSON struct {
	Entries    []decide.Entry `json:"entries"`
	Rule       string         `json:"rule,omitempty"` // empty: no rule matches
	Code       string         `json:"code"`
	Limit      string         `json:"limit,omitempty"`
	LimitID    string         `json:"limit_id,omitempty"`
	RulesFile  string         `json:"rules_file,omitempty"`
	Remaining  int64          `json:"remaining"`
	DeniesNext bool           `json:"denies_next"` // a request of cost 1 would be over a limit now
	ResetAfter string         `json:"reset_after"`
	RetryAfter string         `json:"retry_after,omitempty"`
	Shadow     bool           `json:"shadow,omitempty"`
	Limits     []limitJSON    `json:"limits,omitempty"` // every limit of the rule, each with its own state
}

// limitJSON is one limit of a descriptor's rule and its own counter.
type limitJSON struct {
	Limit      string       `json:"limit"` // as enforced: soft throttling's excess included
	ID         string       `json:"id"`
	Name       string       `json:"name,omitempty"`
	RulesFile  string       `json:"rules_file,omitempty"`
	Throttling string       `json:"throttling,omitempty"` // soft or elastic; hard left out
	Unlimited  bool         `json:"unlimited,omitempty"`
	Block      bool         `json:"block,omitempty"`
	Replaced   bool         `json:"replaced,omitempty"` // another limit of the request replaces it
	Remaining  int64        `json:"remaining"`
	ResetAfter string       `json:"reset_after"`
	DeniesNext bool         `json:"denies_next"`
	Elastic    *elasticJSON `json:"elastic,omitempty"`
	// Regions is a limit of scope global's count in each region, this
	// server's first, as its last round read them.
	Regions []RegionCount `json:"regions,omitempty"`
}

// RegionCounter is an optional ability of a KeysHandler's Inspector: a
// global limit's count in each region, by the store key of its counter
// (decide.LimitState.Key), as a store that keeps one limit across regions
// read them (store/regions); false when it has none for the key.
type RegionCounter interface {
	RegionCounts(key string) ([]RegionCount, bool)
}

// RegionCount is a region's count of a global limit, as last read; what
// the last round counted for it (the count, or, for a peer it did not
// read, the most that peer may have reached); and, on this server's
// region, its cap: the most its count may reach until the next round.
type RegionCount struct {
	Region  string `json:"region"`
	Count   int64  `json:"count"`
	Charged int64  `json:"charged"`
	Cap     int64  `json:"cap,omitempty"`
}

// elasticJSON is an elastic limit's excess (past the limit, up to its
// ceiling) and the domain's pool.
type elasticJSON struct {
	Excess           string `json:"excess"`
	ExcessRemaining  int64  `json:"excess_remaining"`
	ExcessResetAfter string `json:"excess_reset_after"`
	Pool             string `json:"pool"`
	PoolRemaining    int64  `json:"pool_remaining"`
	PoolResetAfter   string `json:"pool_reset_after"`
}

// Inspector is what KeysHandler asks: the Inspect method of
// *decide.Service.
type Inspector interface {
	Inspect(ctx context.Context, r *decide.Request) (*decide.Inspection, error)
}

// KeysHandler serves GET /v1/keys/{domain}/{key}/{value}[/{key}/{value}...]:
// one client's state, by svc's Inspect (a take of cost 0 from each
// counter, which counts nothing), for each prefix of the entries, each a
// descriptor, as a request with those entries would have it decided: the
// rule matched, and each of its limits with what remains of it and when it
// resets; at the top, the limit a decision would name. Values with a slash
// are escaped (%2F). A store that cannot answer gets 503. When svc is a
// RegionCounter too, a limit of scope global shows its count in each
// region.
func KeysHandler(svc Inspector) http.Handler {
	rc, _ := svc.(RegionCounter)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := strings.CutPrefix(r.URL.EscapedPath(), "/v1/keys/")
		if !ok {
			httpjson.Error(w, http.StatusNotFound, "not found")
			return
		}
		parts := strings.Split(p, "/")
		if len(parts) < 3 || len(parts)%2 != 1 || len(parts) > 1+2*MaxKeyEntries {
			httpjson.Error(w, http.StatusBadRequest, fmt.Sprintf("want /v1/keys/DOMAIN/KEY/VALUE with 1 to %d key/value pairs", MaxKeyEntries))
			return
		}
		for i, s := range parts {
			u, err := url.PathUnescape(s)
			if err != nil || (u == "" && i%2 == 0) {
				httpjson.Error(w, http.StatusBadRequest, fmt.Sprintf("path segment %d %q: want a non-empty escaped segment", i+1, s))
				return
			}
			parts[i] = u
		}
		req := &decide.Request{Domain: parts[0]}
		var entries []decide.Entry
		for i := 1; i < len(parts); i += 2 {
			entries = append(entries, decide.Entry{Key: parts[i], Value: parts[i+1]})
			req.Descriptors = append(req.Descriptors, decide.Descriptor{Entries: slices.Clip(entries)})
		}
		ins, err := svc.Inspect(r.Context(), req)
		switch {
		case errors.Is(err, decide.ErrInvalidRequest):
			httpjson.Error(w, http.StatusBadRequest, err.Error())
			return
		case err != nil:
			httpjson.Error(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		out := keyJSON{Domain: req.Domain, UnknownDomain: ins.UnknownDomain}
		for i := range ins.Descriptors {
			out.Descriptors = append(out.Descriptors, descriptorJSON(req.Descriptors[i].Entries, &ins.Descriptors[i], rc))
		}
		writeJSON(w, http.StatusOK, out)
	})
}

// descriptorJSON renders one descriptor's state; rc, if not nil, gives
// its global limits' counts by region.
func descriptorJSON(entries []decide.Entry, ds *decide.DescriptorState, rc RegionCounter) statusJSON {
	s := statusJSON{Entries: entries, Code: decide.OK.String(), ResetAfter: time.Duration(0).String()}
	if ds.Rule == nil {
		return s
	}
	s.Rule, s.Shadow = ds.Rule.Path, ds.Rule.ShadowMode
	for i := range ds.Limits {
		ls := &ds.Limits[i]
		l := ls.Limit
		lj := limitJSON{Limit: l.Enforced().String(), ID: l.ID, Name: l.Name, RulesFile: l.Place(),
			Unlimited: l.Unlimited, Block: l.Block, Replaced: ls.Replaced, Remaining: ls.Decision.Remaining,
			ResetAfter: ls.Decision.ResetAfter.String(), DeniesNext: ls.DeniesNext()}
		if l.Unlimited {
			lj.Limit = "unlimited"
		}
		if l.Throttling != rules.Hard {
			lj.Throttling = l.Throttling.String()
		}
		if l.Throttling == rules.Elastic && l.Pool != nil {
			lj.Elastic = &elasticJSON{Excess: l.Excess().String(), ExcessRemaining: ls.Excess.Remaining,
				ExcessResetAfter: ls.Excess.ResetAfter.String(), Pool: l.Pool.Limit.String(),
				PoolRemaining: ls.Pool.Remaining, PoolResetAfter: ls.Pool.ResetAfter.String()}
		}
		if rc != nil && l.Scope == sluice.GlobalScope && ls.Key != "" {
			lj.Regions, _ = rc.RegionCounts(ls.Key)
		}
		s.DeniesNext = s.DeniesNext || lj.DeniesNext
		s.Limits = append(s.Limits, lj)
	}
	if ds.Binding < 0 {
		return s
	}
	b := &ds.Limits[ds.Binding]
	l := b.Limit
	s.Limit, s.LimitID, s.RulesFile = l.Enforced().String(), l.ID, l.Place()
	s.Remaining, s.ResetAfter = b.Decision.Remaining, b.Decision.ResetAfter.String()
	if !b.Decision.Allowed {
		s.RetryAfter = b.Decision.RetryAfter.String()
		if !s.Shadow {
			s.Code = decide.OverLimit.String()
		}
	}
	return s
}

func sortKeys(ks []Key) {
	slices.SortFunc(ks, func(a, b Key) int { return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Key, b.Key)) })
}

// writeJSON answers v as JSON that no cache keeps: the counts change
// with every decision.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Cache-Control", "no-store")
	httpjson.Write(w, code, v)
}
