package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/shed"
)

// TestReadyzShed: /readyz and /metrics show the load shedder's limit, what
// is in flight and what it shed; saturation does not make it unready.
func TestReadyzShed(t *testing.T) {
	set, err := rules.Parse("r.yaml", []byte("domain: api\n"))
	if err != nil {
		t.Fatal(err)
	}
	gate, err := shed.New(shed.Config{InitialLimit: 4, MinLimit: 4, MaxLimit: 4})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := gate.Acquire(context.Background(), shed.Sheddable); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := gate.Acquire(context.Background(), shed.Sheddable); err == nil {
		t.Fatal("a 4th sheddable admitted")
	}
	if _, err := gate.Acquire(context.Background(), shed.Critical); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := metrics.Shed(reg, gate.Stats); err != nil {
		t.Fatal(err)
	}
	o, err := NewOps(OpsConfig{Rules: func() *rules.Set { return set }, Gatherer: reg, Shed: gate.Stats})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	o.mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var body struct {
		Status string
		Shed   struct {
			Limit     int  `json:"limit"`
			InFlight  int  `json:"in_flight"`
			Saturated bool `json:"saturated"`
			Shed      map[string]uint64
		}
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("/readyz %d %s: %v", rec.Code, rec.Body, err)
	}
	if body.Status != "ready" || body.Shed.Limit != 4 || body.Shed.InFlight != 4 || !body.Shed.Saturated || body.Shed.Shed["sheddable"] != 1 {
		t.Fatalf("/readyz %s", rec.Body)
	}
	if n, err := testutil.GatherAndCount(reg, "sluice_shed_limit", "sluice_shed_shed_total"); err != nil || n != 4 {
		t.Fatalf("shed metrics: %d series, %v", n, err)
	}
}
