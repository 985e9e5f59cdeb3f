package observe

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/httpjson"
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
}

// TopHandler serves GET /v1/top?domain=D&key=K&by=requests|denied&window=1m|1h&n=N:
// the N (default 10, at most MaxTop) clients with the most requests or
// denials (default denied) in the window (default 1m), with the sketch's
// error bound. Without domain and key it lists the pairs counted.
func (o *Decider) TopHandler() http.Handler {
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
				t.Clients = append(t.Clients, hitJSON(h))
			}
		}
		writeJSON(w, http.StatusOK, t)
	})
}

// keyJSON is the body of GET /v1/keys.
type keyJSON struct {
	Domain      string       `json:"domain"`
	Descriptors []statusJSON `json:"descriptors"`
}

type statusJSON struct {
	Entries    []decide.Entry `json:"entries"`
	Rule       string         `json:"rule,omitempty"` // empty: no rule matches
	Code       string         `json:"code"`
	Limit      string         `json:"limit,omitempty"`
	LimitID    string         `json:"limit_id,omitempty"`
	RulesFile  string         `json:"rules_file,omitempty"`
	Remaining  int64          `json:"remaining"`
	DeniesNext bool           `json:"denies_next"` // a request of cost 1 would be over the limit now
	ResetAfter string         `json:"reset_after"`
	RetryAfter string         `json:"retry_after,omitempty"`
	Shadow     bool           `json:"shadow,omitempty"`
	Limits     []string       `json:"limits,omitempty"` // every limit of the rule
}

// KeysHandler serves GET /v1/keys/{domain}/{key}/{value}[/{key}/{value}...]:
// one client's state, by a take of cost 0 from svc (which should be the
// service beneath the Decider, so that looking counts nothing), for each
// prefix of the entries, each a descriptor, as a request with those
// entries would have it decided: the rule matched, the limit with the
// least remaining, what remains and when it resets. Values with a slash
// are escaped (%2F).
func KeysHandler(svc Service) http.Handler {
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
		resp, err := svc.Decide(r.Context(), req)
		if err != nil {
			httpjson.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		out := keyJSON{Domain: req.Domain}
		for i, st := range resp.Statuses {
			s := statusJSON{Entries: req.Descriptors[i].Entries, Code: st.Code.String(), Shadow: st.Shadow,
				Remaining: st.Decision.Remaining, ResetAfter: st.Decision.ResetAfter.String()}
			if st.Code == decide.OverLimit || st.ShadowOverLimit {
				s.RetryAfter = st.Decision.RetryAfter.String()
			}
			s.DeniesNext = st.Limit != nil && (st.Decision.Remaining < 1 || st.Limit.Block)
			if st.Rule != nil {
				s.Rule = st.Rule.Path
				for _, l := range st.Rule.Limits {
					s.Limits = append(s.Limits, l.Enforced().String())
				}
			}
			if l := st.Limit; l != nil {
				s.Limit, s.LimitID, s.RulesFile = l.Enforced().String(), l.ID, l.Place()
			}
			out.Descriptors = append(out.Descriptors, s)
		}
		writeJSON(w, http.StatusOK, out)
	})
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
