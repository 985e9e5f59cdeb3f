package server

import (
	"bufio"
	"context"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/store/memory"
)

// TestRSS measures the resident memory of the server's decision path, built
// as serve builds it (newCore: rules, the memory store of --max-memory,
// decide and its metrics), holding many clients: one per random IPv6 /64,
// each a remote_address descriptor under a limit per hour, so that none
// expires during the test. It runs only when SLUICE_RSS_CLIENTS is set, in
// a process of its own:
//
//	SLUICE_RSS_CLIENTS=1000000 SLUICE_RSS_MAX_MEMORY=256MiB go test -run TestRSS -v -timeout 30m ./server/
//
// It reports the process's resident memory (VmRSS, and its peak VmHWM)
// before and after, per client held, and against --max-memory, and fails
// when the peak is more than 10% above --max-memory plus the process's
// resident memory before the store held anything.
func TestRSS(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_RSS_CLIENTS"))
	if n <= 0 {
		t.Skip("set SLUICE_RSS_CLIENTS (and SLUICE_RSS_MAX_MEMORY) to measure")
	}
	maxMemory := uint64(memory.DefaultMaxBytes)
	if v := os.Getenv("SLUICE_RSS_MAX_MEMORY"); v != "" {
		var err error
		if maxMemory, err = humanize.ParseBytes(v); err != nil {
			t.Fatalf("SLUICE_RSS_MAX_MEMORY: %v", err)
		}
	}
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	rulesYAML := "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"
	if err := os.WriteFile(rulesFile, []byte(rulesYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testConfig(rulesFile)
	c.Store.MaxMemory = int64(maxMemory)
	co := newTestCore(t, c)
	mem, ok := co.stores.Local().(*memory.Store)
	if !ok {
		t.Fatalf("the store is a %T", co.stores.Local())
	}
	runtime.GC()
	rss0, _ := procStatus(t, "VmRSS")
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(n), 64))
	req := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "remote_address"}}, Cost: 1}}}
	start := time.Now()
	for i := range n {
		var a [16]byte
		a[0], a[1] = 0x20, 0x01
		for j := 2; j < 8; j++ {
			a[j] = byte(rng.Uint32())
		}
		req.Descriptors[0].Entries[0].Value = netip.PrefixFrom(netip.AddrFrom16(a), 64).String()
		resp, err := co.svc.Decide(ctx, req)
		if err != nil || resp.Overall != decide.OK || resp.Mode != decide.ModeStore {
			t.Fatalf("client %d: %+v, %v", i, resp, err)
		}
	}
	took := time.Since(start)
	rss, _ := procStatus(t, "VmRSS")
	hwm, _ := procStatus(t, "VmHWM")
	keys, live := mem.Usage()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("%d clients sent in %v; --max-memory %s; the store holds %d keys, accounts for %s of live data (%.0f B/key)",
		n, took.Round(time.Millisecond), humanize.IBytes(uint64(maxMemory)), keys, humanize.IBytes(uint64(live)), float64(live)/float64(keys))
	t.Logf("VmRSS %s before, %s after (%.0f B/key of growth), peak VmHWM %s; peak/--max-memory %.3f, (peak-before)/--max-memory %.3f; heap in use %s, GCs %d",
		humanize.IBytes(rss0), humanize.IBytes(rss), float64(rss-rss0)/float64(keys), humanize.IBytes(hwm),
		float64(hwm)/float64(maxMemory), float64(hwm-rss0)/float64(maxMemory), humanize.IBytes(ms.HeapInuse), ms.NumGC)
	if limit := rss0 + uint64(maxMemory)*11/10; hwm > limit {
		t.Errorf("peak resident memory %s: more than --max-memory %s + 10%% above the %s before", humanize.IBytes(hwm), humanize.IBytes(uint64(maxMemory)), humanize.IBytes(rss0))
	}
}

// procStatus returns the field of /proc/self/status in bytes.
func procStatus(t *testing.T, field string) (uint64, bool) {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return kb << 10, true
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0, false
}
