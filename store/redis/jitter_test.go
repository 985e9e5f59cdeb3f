package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestExpiryJitter checks Config.ExpiryJitter: the keys of one fixed
// window, which all reset at its end, get TTLs spread over the jitter
// past that end plus twice the margin, where without jitter they get the
// same TTL.
func TestExpiryJitter(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l := sluice.Limit{Rate: 10, Period: time.Hour}
	// pttls takes one hit on each of 40 keys, one script call each, at
	// one instant, and returns the least and most PTTL, in ms.
	pttls := func(jitter time.Duration) (lo, hi int64) {
		cfg := testConfig(func() time.Time { return t0 })
		cfg.ExpiryMargin, cfg.ExpiryJitter = time.Second, jitter
		s := open(t, "redis://"+addr, cfg)
		lo, hi = 1<<62, -1
		for i := range 40 {
			key := fmt.Sprintf("jitter-%d", i)
			if d, err := sluice.Take(ctx, s, key, l, 1); err != nil || !d.Allowed {
				t.Fatalf("Take %s = %+v, %v", key, d, err)
			}
			pttl, err := c.Do(ctx, c.B().Pttl().Key(cfg.KeyPrefix+key).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			lo, hi = min(lo, pttl), max(hi, pttl)
		}
		return lo, hi
	}
	// t0 is 30 minutes and 30 s into its hour: the window resets in 29m30s.
	reset := (29*time.Minute + 30*time.Second).Milliseconds()
	if lo, hi := pttls(0); lo < reset+2000-1000 || hi > reset+2000+2 { // ms roundings
		t.Errorf("without jitter: PTTLs %d to %d ms, want %d (less the test's time)", lo, hi, reset+2000)
	}
	// 40 draws of 0-5 min: all within 2.5 min of each other has odds
	// below 2^-38; the TTL is reset + 2 × (margin + draw/2).
	if lo, hi := pttls(5 * time.Minute); lo < reset+2000-1000 || hi > reset+2000+5*60*1000+2 || hi-lo < 150*1000 {
		t.Errorf("with 5 min of jitter: PTTLs %d to %d ms, want %d to %d, spread over more than 2.5 min",
			lo, hi, reset+2000, reset+2000+5*60*1000)
	}
}
