package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestConcurrencyAcrossServers: two servers on one Redis count a
// concurrency limit's requests in flight together (the stack's
// SlotCounter, handed to admit), and a slot given back on one is taken on
// the other; on the memory store each server counts its own.
func TestConcurrencyAcrossServers(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			domain := fmt.Sprintf("slots-%s-%d", store, time.Now().UnixNano())
			rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
			if err := os.WriteFile(rulesFile, []byte("domain: "+domain+"\ndescriptors:\n  - key: user\n    concurrency: 2\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			c := testConfig(rulesFile)
			if store == "redis" {
				c.Store.URL, c.StoreTimeout = "redis://"+testenv.RedisAddr(t), time.Second
			}
			a, b := newTestCore(t, c), newTestCore(t, c)
			ctx := context.Background()
			r := &decide.Request{Domain: domain, Hold: true, Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: "alice"}}, Cost: 1}}}
			var held []*decide.Response
			var codes []decide.Code
			ask := func(co *core) {
				t.Helper()
				resp, err := co.svc.Decide(ctx, r)
				if err != nil || resp.Mode != decide.ModeStore {
					t.Fatalf("%+v, %v", resp, err)
				}
				codes = append(codes, resp.Overall)
				held = append(held, resp)
			}
			for _, co := range []*core{a, b, a, b} {
				ask(co)
			}
			ok, over := decide.OK, decide.OverLimit
			want := []decide.Code{ok, ok, ok, ok} // each its own 2
			if store == "redis" {
				want = []decide.Code{ok, ok, over, over} // 2 between them
			}
			if !slices.Equal(codes, want) {
				t.Fatalf("four requests in flight on two servers: %v, want %v", codes, want)
			}
			held[0].Done(ctx) // a's first ends
			codes = codes[:0]
			ask(b)
			ask(b)
			want = []decide.Code{over, over} // b holds its own 2
			if store == "redis" {
				want = []decide.Code{ok, over} // the one a gave back
			}
			if !slices.Equal(codes, want) {
				t.Fatalf("after one ended on the other server: %v, want %v", codes, want)
			}
		})
	}
}
