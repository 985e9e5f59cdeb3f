package respond

import (
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/shed"
)

// Priority returns the load shedding priority of a decided request: the
// highest `priority` stated by the rules its descriptors matched, so a
// request that any rule calls critical is critical, and one that only
// rules without a priority match besides a sheddable one (a per-address
// limit every request meets) is sheddable; Default when no rule states
// one (or resp is nil).
func Priority(resp *decide.Response) shed.Priority {
	p, seen := shed.Sheddable, false
	if resp != nil {
		for i := range resp.Statuses {
			r := resp.Statuses[i].Rule
			if r == nil || r.Priority == "" {
				continue
			}
			q := shed.Default
			switch r.Priority {
			case rules.PriorityCritical:
				q = shed.Critical
			case rules.PrioritySheddable:
				q = shed.Sheddable
			}
			if !seen || q > p {
				p, seen = q, true
			}
		}
	}
	if !seen {
		return shed.Default
	}
	return p
}

// Shed answers 503 for a request the load shedder shed: Retry-After (1 s
// plus the Writer's jitter) and {"error":"overloaded","retry_after":N}.
func (w *Writer) Shed(rw http.ResponseWriter) {
	s := int64(1)
	if w.jitter > 0 {
		s += w.rand(w.jitter + 1)
	}
	n := strconv.FormatInt(s, 10)
	body := `{"error":"overloaded","retry_after":` + n + "}\n"
	h := rw.Header()
	h["Retry-After"] = []string{n}
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["Cache-Control"] = []string{"no-store"}
	rw.WriteHeader(http.StatusServiceUnavailable)
	_, _ = rw.Write([]byte(body))
}

// Outcome records what an upstream answered, for the load shedder's
// measurement: wrap the ResponseWriter with it before the upstream (or
// handler) writes. It passes everything through, and Unwrap lets
// http.ResponseController reach the writer beneath.
type Outcome struct {
	http.ResponseWriter
	Status int // 0 until the headers are written
}

// WriteHeader records the status and writes it.
func (o *Outcome) WriteHeader(code int) {
	if o.Status == 0 && code >= 200 {
		o.Status = code
	}
	o.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200 and writes b.
func (o *Outcome) Write(b []byte) (int, error) {
	if o.Status == 0 {
		o.Status = http.StatusOK
	}
	return o.ResponseWriter.Write(b)
}

// Unwrap returns the writer beneath.
func (o *Outcome) Unwrap() http.ResponseWriter { return o.ResponseWriter }

// Gated serves r with next behind gate (nil: no gate): a request the gate
// sheds gets 503 from w; an admitted one reports its latency and whether
// it failed (5xx, or no answer while the client was still there). A client
// gone before an answer says nothing about the upstream: its slot is
// dropped without a measurement.
func (w *Writer) Gated(gate *shed.Gate, p shed.Priority, rw http.ResponseWriter, r *http.Request, next http.Handler) {
	if gate == nil {
		next.ServeHTTP(rw, r)
		return
	}
	t, err := gate.Acquire(r.Context(), p)
	if err != nil {
		if r.Context().Err() == nil {
			w.Shed(rw)
		}
		return
	}
	o := &Outcome{ResponseWriter: rw}
	defer func() {
		switch {
		case o.Status == 0 && r.Context().Err() != nil:
			t.Drop()
		default:
			t.Done(o.Status == 0 || o.Status >= 500)
		}
	}()
	next.ServeHTTP(o, r)
}
