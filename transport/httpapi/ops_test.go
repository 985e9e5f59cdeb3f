package httpapi

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
)

// TestOps serves the operational endpoints alone, as an ops listener does,
// before the rules load, while serving and while draining.
func TestOps(t *testing.T) {
	t.Parallel()
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	var current *rules.Set
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_gauge", Help: "A gauge."}))
	var storeErr error = errors.New("store not reached yet")
	o, err := NewOps(OpsConfig{Rules: func() *rules.Set { return current }, Gatherer: reg,
		Ready:         func() error { return storeErr },
		FailDecisions: func() map[string]uint64 { return map[string]uint64{"fail_open": 7} }})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Handle("GET /debug/x", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })); err != nil {
		t.Fatal(err)
	}
	if err := o.Handle("GET /healthz", http.NotFoundHandler()); err == nil {
		t.Error("mounting /healthz twice: no error")
	}
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		o.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	steps := []struct {
		name  string
		step  func()
		paths map[string]int
	}{
		{"before the rules", func() {}, map[string]int{"/healthz": 200, "/readyz": 503, "/healthcheck": 500, "/metrics": 200, "/debug/x": 204, "/v1/decide": 404}},
		{"store not reached", func() { current = set }, map[string]int{"/healthz": 200, "/readyz": 503, "/healthcheck": 500}},
		{"serving", func() { storeErr = nil }, map[string]int{"/healthz": 200, "/readyz": 200, "/healthcheck": 200}},
		{"draining", o.Drain, map[string]int{"/healthz": 200, "/readyz": 503, "/healthcheck": 500, "/metrics": 200}},
	}
	for _, st := range steps {
		st.step()
		for path, want := range st.paths {
			if code, body := get(path); code != want {
				t.Errorf("%s: GET %s = %d %s, want %d", st.name, path, code, body, want)
			}
		}
		if st.name == "store not reached" {
			if _, body := get("/readyz"); !strings.Contains(body, `"reason":"store not reached yet"`) {
				t.Errorf("%s: /readyz = %s, want the reason", st.name, body)
			}
		}
	}
	if _, body := get("/readyz"); !strings.Contains(body, `"fail_decisions":{"fail_open":7}`) {
		t.Errorf("/readyz = %s, want the fail-mode decisions", body)
	}
	if _, body := get("/metrics"); !strings.Contains(body, "test_gauge 0") {
		t.Errorf("/metrics = %s, want the registry's gauge", body)
	}
	if _, err := NewOps(OpsConfig{}); err == nil {
		t.Error("NewOps without Rules: no error")
	}
}
