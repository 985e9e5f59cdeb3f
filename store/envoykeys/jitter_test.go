package envoykeys_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/envoykeys"
	"github.com/sluicehq/sluice/store/memory"
)

// TestExpiryJitter checks Config.ExpiryJitter: the keys of one window get
// EXPIRE period plus a random number of whole seconds below the jitter,
// as Envoy's EXPIRATION_JITTER_MAX_SECONDS; without it, the period.
func TestExpiryJitter(t *testing.T) {
	t.Parallel()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.RedisAddr(t)}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	mem, err := memory.New(memory.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	now := func() time.Time { return t0 }
	l := sluice.Limit{Rate: 10, Period: time.Minute}
	ctx := context.Background()
	prefix := fmt.Sprintf("jitter%d_", time.Now().UnixNano())
	ttls := func(jitter time.Duration, name string) (lo, hi int64) {
		s := envoykeys.New(mem, func() rueidis.Client { return c }, envoykeys.Config{Now: now, ExpiryJitter: jitter, Prefix: prefix + name + "_"})
		lo, hi = 1<<62, -1
		for i := range 40 {
			k := fmt.Sprintf("%s%s_api_user_u%d_", prefix, name, i)
			if d, err := takeEnvoy(s, l, "api", "user", fmt.Sprintf("u%d", i)); err != nil || !d.Allowed {
				t.Fatalf("Take %s = %+v, %v", k, d, err)
			}
			ttl, err := c.Do(ctx, c.B().Ttl().Key(k+window(60)).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			lo, hi = min(lo, ttl), max(hi, ttl)
		}
		return lo, hi
	}
	if lo, hi := ttls(0, "plain"); lo < 59 || hi > 60 {
		t.Errorf("without jitter: TTLs from %d to %d s, want 60 (a second may pass)", lo, hi)
	}
	// 40 draws from 0-299 s: all within 150 s of each other has odds
	// below 2^-38.
	if lo, hi := ttls(300*time.Second, "jittered"); lo < 59 || hi > 60+299 || hi-lo < 150 {
		t.Errorf("with 300 s of jitter: TTLs from %d to %d s, want 60 to 359 s, spread over more than 150 s", lo, hi)
	}
}
