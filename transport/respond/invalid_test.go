package respond_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestInvalidRequestRefused: a request that decide refuses as invalid is
// one whose client chose the values (a header or a path beyond decide's
// caps), so every HTTP way in answers 400 naming the cap, even when it
// fails open. Letting it through let any client past every limit, the
// per-IP one included, by sending one header of 5,000 bytes.
func TestInvalidRequestRefused(t *testing.T) {
	t.Parallel()
	for _, way := range waysIn(t) {
		t.Run(way.name, func(t *testing.T) {
			t.Parallel()
			h, err := way.make(t, byKey(t), service(t, "domain: api\ndescriptors:\n  - {key: key, rate_limit: {name: k, unit: minute, requests_per_unit: 1}}\n", clocktest.New(t0)), false)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.Header.Set("X-Key", strings.Repeat("k", 5000))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "more than the cap of 4096") {
					t.Fatalf("request %d with a 5,000-byte key: %d %q, want 400 naming the cap", i+1, w.Code, w.Body)
				}
			}
		})
	}
}
