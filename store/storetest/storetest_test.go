package storetest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// generous is a store that admits, on each key, one request more than its
// limit: the first one its store denies. It stands for a store whose bound
// is one hit.
type generous struct {
	sluice.Store
	mu    sync.Mutex
	given map[string]bool
}

func (g *generous) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	err := g.Store.TakeAll(ctx, reqs, ds)
	if err != nil || len(reqs) != 1 || ds[0].Allowed || reqs[0].Cost != 1 {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.given[reqs[0].Key] {
		return nil
	}
	g.given[reqs[0].Key] = true
	ds[0] = sluice.Decision{Allowed: true, Limit: ds[0].Limit}
	return nil
}

func newGenerous(t *testing.T, now func() time.Time, n int) []sluice.Store {
	cfg := memory.DefaultConfig()
	cfg.Now = now
	m, err := memory.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	g := &generous{Store: m, given: map[string]bool{}}
	nodes := make([]sluice.Store, n)
	for i := range nodes {
		nodes[i] = g
	}
	return nodes
}

// TestBoundedStore checks that a store that states its bound passes the
// contract tier.
func TestBoundedStore(t *testing.T) {
	storetest.RunContract(t, newGenerous, storetest.Bound{
		Over: func(sluice.Limit, int) int64 { return 1 },
	})
}

// TestContractCatchesOverAdmission checks that the contract tier fails a
// store that admits more than it states: it runs the tier on the
// generous store with the exact bound in a child process and wants it
// to fail where the bound is checked.
func TestContractCatchesOverAdmission(t *testing.T) {
	if os.Getenv("STORETEST_CHILD") == "1" {
		storetest.RunContract(t, newGenerous, storetest.Bound{})
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestContractCatchesOverAdmission$", "-test.count=1")
	cmd.Env = append(os.Environ(), "STORETEST_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the contract tier passed a store that admits one hit too many:\n%s", out)
	}
	if !strings.Contains(string(out), "admitted 41, want 40 (bound [40, 40])") {
		t.Fatalf("the contract tier failed, but not on the bound:\n%s", out)
	}
}
