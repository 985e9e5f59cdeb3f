package regions

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestRedisSiteCarry: what a node carries (Carry) is merged by maximum
// within a window, replaced by a later window's, kept over an earlier
// one's, read back beside the keys asked in their order (nothing for a key
// never carried), and the hash expires when the last window carried ends.
// A carried count that is not "window count" is refused. On a standalone
// Redis and on a Redis Cluster, with region names whose board's slot the
// hash shares (a tag of its own, the board's tag) and one whose it does
// not (read in a second call).
func TestRedisSiteCarry(t *testing.T) {
	backends := []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"single", func(t *testing.T) string { return "redis://" + testenv.RedisAddr(t) + "/0" }},
		{"cluster", func(t *testing.T) string { return "redis+cluster://" + strings.Join(testenv.RedisClusterAddrs(t), ",") }},
	}
	for _, b := range backends {
		for _, region := range []string{"r0", "{tag}r0", "odd}r0"} {
			t.Run(b.name+"/"+region, func(t *testing.T) {
				prefix := fmt.Sprintf("sluicetest:%x:", rand.Uint64())
				cfg := redisstore.DefaultConfig()
				cfg.KeyPrefix = prefix
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				st, err := redisstore.Open(ctx, b.url(t), cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				site := NewRedisSite(st, st.Conn, nil, region, prefix, 0)
				if err := site.Beat(ctx, Node{Region: "r0", ID: "n0", Seq: 1}, time.Second); err != nil {
					t.Fatal(err)
				}
				r, err := site.Read(ctx, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				p := time.Minute.Microseconds()
				w := windowStart(r.Now, p)
				steps := [][]Carried{
					{{Key: "a", Window: w, Count: 10, Until: w + p}, {Key: "b", Window: w, Count: 5, Until: w + p}},
					{{Key: "a", Window: w, Count: 7, Until: w + p}, {Key: "b", Window: w + p, Count: 3, Until: w + 2*p}},
					{{Key: "b", Window: w, Count: 9, Until: w + p}},
				}
				for _, cs := range steps {
					if err := site.Carry(ctx, cs); err != nil {
						t.Fatal(err)
					}
				}
				reqs := []sluice.Request{{Key: "c", Limit: perMinute}, {Key: "a", Limit: perMinute}, {Key: "b", Limit: perMinute}}
				if r, err = site.Read(ctx, reqs, []bool{true, true, true}); err != nil {
					t.Fatal(err)
				}
				want := []Carried{{}, {Window: w, Count: 10}, {Window: w + p, Count: 3}}
				if fmt.Sprint(r.Carried) != fmt.Sprint(want) {
					t.Errorf("carried %v, want %v", r.Carried, want)
				}
				client, err := st.Conn()
				if err != nil {
					t.Fatal(err)
				}
				hb, hc := client.B().Hgetall().Key(site.board).Build(), client.B().Hmget().Key(site.carry).Field("a").Build()
				apart := hb.Slot() != hc.Slot()
				if want := strings.HasPrefix(region, "odd"); apart != want {
					t.Errorf("board %q and carry hash %q apart: %v, want %v", site.board, site.carry, apart, want)
				}
				ttl, err := client.Do(ctx, client.B().Pttl().Key(site.carry).Build()).AsInt64()
				if until := (w + 2*p - r.Now) / 1000; err != nil || ttl <= 0 || ttl > until+1 {
					t.Errorf("the carry hash lives %d ms (%v), want up to %d", ttl, err, until)
				}
				if err := client.Do(ctx, client.B().Hset().Key(site.carry).FieldValue().FieldValue("a", "x").Build()).Error(); err != nil {
					t.Fatal(err)
				}
				if _, err := site.Read(ctx, reqs, []bool{true, true, true}); !errors.Is(err, ErrRefused) {
					t.Errorf("a malformed carried count read with %v, want ErrRefused", err)
				}
			})
		}
	}
}
