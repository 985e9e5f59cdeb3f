package ui_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/ui"
)

func newHandler(t testing.TB) *ui.Handler {
	t.Helper()
	set, err := rules.Parse("r.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.New(ui.Config{Rules: func() *rules.Set { return set }, Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func post(h http.Handler, body string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/ui/api/simulate", strings.NewReader(body)))
	return w
}

func TestSimulateAPI(t *testing.T) {
	t.Parallel()
	h := newHandler(t)
	rulesYAML := `domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n`
	w := post(h, `{"rules":"`+rulesYAML+`","traffic":"idle 59s; burst 100; idle 1s; burst 100","algorithms":["sliding_window"]}`)
	var res struct {
		Series []struct {
			Limit             string
			MaxAdmittedWindow int64 `json:"max_admitted_window"`
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || w.Code != 200 || len(res.Series) != 2 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if res.Series[0].MaxAdmittedWindow != 200 || res.Series[1].MaxAdmittedWindow != 100 {
		t.Errorf("%+v, want 200 admitted in a minute by the fixed window and 100 by the sliding one", res.Series)
	}
	for _, tc := range []struct{ body, error string }{
		{`{"rules":"domain: [","traffic":"burst 1"}`, "rules"},
		{`{"rules":"` + rulesYAML + `","traffic":"jump"}`, "traffic"},
		{`{"rules":"` + rulesYAML + `","traffic":"burst 1","algorithms":["fast"]}`, "algorithm"},
		{`{"rules":"` + rulesYAML + `","traffic":"burst 1","extra":1}`, "unknown field"},
		{`{"rules":"` + strings.Repeat("x", ui.MaxSimulateBody) + `"}`, "at most"},
	} {
		w := post(h, tc.body)
		if w.Code/100 != 4 || !strings.Contains(w.Body.String(), tc.error) {
			t.Errorf("%.60s: %d %s, want 4xx with %q", tc.body, w.Code, w.Body, tc.error)
		}
	}
}

func TestPages(t *testing.T) {
	t.Parallel()
	h := newHandler(t)
	for path, want := range map[string]string{
		"/ui/": "app.js", "/ui/simulate": "simchart.js", "/ui/static/uplot/LICENSE": "MIT", "/ui/api/stats": `"domains"`,
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if w.Code != 200 || !strings.Contains(w.Body.String(), want) || w.Header().Get("Content-Security-Policy") == "" {
			t.Errorf("%s: %d, want 200 with %q and a CSP", path, w.Code, want)
		}
	}
}

func TestEvents(t *testing.T) {
	t.Parallel()
	e := ui.NewEvents(2)
	t0 := time.Unix(0, 0)
	e.Add(t0, nil, errors.New("one"))
	e.Add(t0.Add(time.Second), nil, errors.New("two"))
	e.Add(t0.Add(2*time.Second), nil, errors.New("three"))
	l := e.List()
	if len(l) != 2 || l[0].Error != "three" || l[1].Error != "two" {
		t.Errorf("%+v, want three then two", l)
	}
}

func FuzzSimulateBody(f *testing.F) {
	h := newHandler(f)
	f.Add(`{"rules":"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n","traffic":"steady 5/s 2s"}`)
	f.Add(`{"traffic":"burst 3"}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		w := post(h, body)
		if w.Code != 200 && w.Code != 400 && w.Code != 413 {
			t.Fatalf("%q: %d", body, w.Code)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%q: body %q", body, w.Body)
		}
	})
}

// TestStatsFailDecisions: the dashboard's stats carry the decisions the
// store did not make, by mode, from sluice_fail_mode_decisions_total.
func TestStatsFailDecisions(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	fails := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_fail_mode_decisions_total", Help: "h"}, []string{"mode"})
	reg.MustRegister(fails)
	fails.WithLabelValues("fail_open").Add(3)
	fails.WithLabelValues("slow").Add(2)
	h, err := ui.New(ui.Config{Rules: func() *rules.Set { return nil }, Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/ui/api/stats", nil))
	var st struct {
		FailDecisions map[string]float64 `json:"fail_decisions"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.FailDecisions["fail_open"] != 3 || st.FailDecisions["slow"] != 2 {
		t.Errorf("/ui/api/stats: %v %s, want fail_decisions fail_open 3 and slow 2", err, w.Body)
	}
}
