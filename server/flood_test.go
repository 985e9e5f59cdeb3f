package server

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
)

// TestFloodThroughDecide is issue 18's attack on the decision path as
// serve builds it: a user limited to 5 an hour keeps sending while 5,000
// clients it has never seen (random IPv6 /64s) are decided beside it, with
// MaxEntries 1000. The user must be admitted 5 times, not 5 more each
// time the store forgets it. (A token bucket refilled at 5 an hour, so
// that no window boundary falls within the test.)
func TestFloodThroughDecide(t *testing.T) {
	t.Parallel()
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	rulesYAML := `domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket}
`
	if err := os.WriteFile(rulesFile, []byte(rulesYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testConfig(rulesFile)
	c.Fail, c.StoreTimeout, c.Store.MaxEntries = decide.FailClosed, time.Second, 1000
	co := newTestCore(t, c)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 18))
	user := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{
		{Entries: []decide.Entry{{Key: "remote_address", Value: "2001:db8::/64"}}, Cost: 1},
		{Entries: []decide.Entry{{Key: "user", Value: "mallory"}}, Cost: 1},
	}}
	other := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "remote_address"}}, Cost: 1}}}
	admitted := 0
	for i := range 5000 {
		resp, err := co.svc.Decide(ctx, user)
		if err != nil || resp.Mode != decide.ModeStore {
			t.Fatalf("request %d: %+v, %v", i, resp, err)
		}
		if resp.Overall == decide.OK {
			admitted++
		}
		var a [16]byte
		a[0], a[1] = 0x20, 0x01
		for j := 2; j < 8; j++ {
			a[j] = byte(rng.Uint32())
		}
		other.Descriptors[0].Entries[0].Value = netip.PrefixFrom(netip.AddrFrom16(a), 64).String()
		if _, err := co.svc.Decide(ctx, other); err != nil {
			t.Fatal(err)
		}
	}
	if admitted != 5 {
		t.Fatalf("the user, limited to 5 an hour, was admitted %d times during the flood", admitted)
	}
}

// newTestCore returns the core of c, logging nowhere, closed when the
// test ends.
func newTestCore(t *testing.T, c Config) *core {
	t.Helper()
	c.Logger = slog.New(slog.DiscardHandler)
	c, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	co, err := newCore(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := co.close(); err != nil {
			t.Error(err)
		}
	})
	return co
}
