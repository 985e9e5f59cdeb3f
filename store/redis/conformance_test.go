package redis

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/storetest"
)

// TestConformance runs the conformance suite of sluice.Store on a single
// Redis and on the Redis Cluster, with the suite's clock instead of TIME.
func TestConformance(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
				return open(t, url, testConfig(now))
			})
		})
	}
}
