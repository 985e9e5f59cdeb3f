package decide_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/decide"
)

const capsRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
    descriptors:
      - key: path
        rate_limits:
          - {unit: minute, requests_per_unit: 1}
          - {unit: hour, requests_per_unit: 10}
`

// many returns a request of n descriptors user=u<i>.
func many(n int) *decide.Request {
	r := &decide.Request{Domain: "api", Descriptors: make([]decide.Descriptor, n)}
	for i := range r.Descriptors {
		r.Descriptors[i] = decide.Descriptor{Entries: []decide.Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}, Cost: 1}
	}
	return r
}

// TestCaps checks the caps on one request: each request beyond one is
// refused as invalid, naming the cap, before the store sees anything; a
// request at the caps is decided.
func TestCaps(t *testing.T) {
	t.Parallel()
	set := loadRules(t, capsRules)
	def := decide.DefaultConfig()
	deep := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Cost: 1}}}
	for range def.MaxEntries + 1 {
		deep.Descriptors[0].Entries = append(deep.Descriptors[0].Entries, decide.Entry{Key: "user", Value: "a"})
	}
	tests := []struct {
		name string
		req  *decide.Request
		msg  string // "" when decided
	}{
		{"60,000 descriptors", many(60000), "60000 descriptors, more than the cap of 64 per request"},
		{"one descriptor too many", many(def.MaxDescriptors + 1), "65 descriptors, more than the cap of 64"},
		{"descriptors at the cap", many(def.MaxDescriptors), ""},
		{"entries", deep, "descriptor 0: 33 entries, more than the cap of 32 per descriptor"},
		{"1 MB value", req("api", []string{"user", strings.Repeat("v", 1<<20)}), "entry 0: value of 1048576 bytes, more than the cap of 4096"},
		{"value at the cap", req("api", []string{"user", strings.Repeat("v", def.MaxValueBytes)}), ""},
		{"long key", req("api", []string{"user", "a", strings.Repeat("k", def.MaxValueBytes+1), "b"}), "entry 1: key of 4097 bytes, more than the cap of 4096"},
		{"long domain", req(strings.Repeat("d", def.MaxValueBytes+1), []string{"user", "a"}), "domain of 4097 bytes, more than the cap of 4096"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			rec := &recorder{Store: newMemory(t, clk)}
			s := newService(t, set, clk, decide.Config{Store: rec})
			resp, err := s.Decide(context.Background(), tt.req)
			if tt.msg == "" {
				if err != nil || resp.Overall != decide.OK {
					t.Fatalf("Decide = %+v, %v; want OK", resp, err)
				}
				return
			}
			if !errors.Is(err, decide.ErrInvalidRequest) || resp != nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Decide = %v, %v; want ErrInvalidRequest saying %q", resp, err, tt.msg)
			}
			if n := len(rec.requests()); n != 0 {
				t.Errorf("the store saw %d requests of a refused request", n)
			}
		})
	}
}

// TestLongValuesDigested checks that values longer than DigestAbove reach
// the store as fixed-size digests in keys and groups: a 1 MB value (with
// MaxValueBytes raised to let it in) makes a key of under 100 bytes, one
// counter per value, and neither a short value spelled as that digest nor
// a short value that looks like a digest shares its counter.
func TestLongValuesDigested(t *testing.T) {
	t.Parallel()
	set := loadRules(t, capsRules)
	clk := newClock()
	rec := &recorder{Store: newMemory(t, clk)}
	s := newService(t, set, clk, decide.Config{Store: rec, MaxValueBytes: 2 << 20})
	huge := strings.Repeat("x", 1<<20)
	sum := sha256.Sum256([]byte(huge))
	spelled := "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:16])
	short := strings.Repeat("s", decide.DefaultConfig().DigestAbove)

	decide1 := func(v string, want decide.Code) {
		t.Helper()
		resp := decideOK(t, s, req("api", []string{"user", v, "path", huge}))
		if resp.Overall != want {
			t.Fatalf("user of %d bytes %.12q...: %v, want %v", len(v), v, resp.Overall, want)
		}
	}
	decide1(huge, decide.OK)
	decide1(huge, decide.OverLimit)              // the same value: the same counters
	decide1(huge+"y", decide.OK)                 // another long value: other counters
	decide1(spelled, decide.OK)                  // the digest spelled out: not the long value's
	decide1(spelled[:len(spelled)-1], decide.OK) // looks like a digest: digested too
	decide1(short, decide.OK)                    // at DigestAbove: kept as it is
	decide1(short, decide.OverLimit)

	reqs := rec.requests()
	if len(reqs) == 0 {
		t.Fatal("the store saw nothing")
	}
	for _, r := range reqs {
		if len(r.Key) > 100+2*len(short) || len(r.Group) > 100+2*len(short) {
			t.Errorf("the store saw a key of %d bytes and a group of %d", len(r.Key), len(r.Group))
		}
		if strings.Contains(r.Key, huge[:300]) {
			t.Errorf("a long value reached the store's key %.40q...", r.Key)
		}
	}
	if !strings.Contains(reqs[len(reqs)-1].Key, short) {
		t.Errorf("a value of DigestAbove bytes was not kept as it is: %.60q", reqs[len(reqs)-1].Key)
	}
}

// TestLongValuesDefaults checks the defaults end to end: a 1 MB value is
// refused, and one of 4 KiB reaches the store as a short key.
func TestLongValuesDefaults(t *testing.T) {
	t.Parallel()
	set := loadRules(t, capsRules)
	clk := newClock()
	rec := &recorder{Store: newMemory(t, clk)}
	s := newService(t, set, clk, decide.Config{Store: rec})
	if _, err := s.Decide(context.Background(), req("api", []string{"user", strings.Repeat("v", 1<<20)})); !errors.Is(err, decide.ErrInvalidRequest) {
		t.Fatalf("a 1 MB value: %v, want ErrInvalidRequest", err)
	}
	decideOK(t, s, req("api", []string{"user", strings.Repeat("v", 4096)}))
	for _, r := range rec.requests() {
		if len(r.Key) > 100 {
			t.Errorf("a 4 KiB value made a key of %d bytes", len(r.Key))
		}
	}
}

// FuzzDecideCaps decides requests built from arbitrary bytes under small
// caps: every answer is a decision or ErrInvalidRequest, and no key or
// group the store sees holds a value longer than DigestAbove.
func FuzzDecideCaps(f *testing.F) {
	f.Add("api", "user", "alice", "path", "/a", uint8(1))
	f.Add("api", "user", strings.Repeat("v", 40), "path", "sha256:x", uint8(3))
	f.Add("", "", "", "", "", uint8(0))
	f.Add("api", "user", "a", "path", strings.Repeat("p", 70), uint8(9))
	set := loadRules(f, capsRules)
	clk := newClock()
	mem := newMemory(f, clk)
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, n uint8) {
		rec := &recorder{Store: mem}
		cfg := decide.Config{Store: rec, MaxDescriptors: 4, MaxEntries: 3, MaxValueBytes: 64, DigestAbove: 16}
		s := newService(t, set, clk, cfg)
		r := &decide.Request{Domain: domain}
		for i := range int(n % 8) {
			d := decide.Descriptor{Cost: int64(i % 3), Entries: []decide.Entry{{Key: k1, Value: v1}}}
			if i%2 == 1 {
				d.Entries = append(d.Entries, decide.Entry{Key: k2, Value: v2})
			}
			r.Descriptors = append(r.Descriptors, d)
		}
		resp, err := s.Decide(context.Background(), r)
		if err != nil {
			if !errors.Is(err, decide.ErrInvalidRequest) || resp != nil {
				t.Fatalf("Decide = %v, %v; want a response or ErrInvalidRequest", resp, err)
			}
			if len(rec.requests()) != 0 {
				t.Fatal("the store saw a refused request")
			}
			return
		}
		for _, q := range rec.requests() {
			for _, v := range []string{v1, v2} {
				if len(v) > cfg.DigestAbove && (strings.Contains(q.Key, v) || strings.Contains(q.Group, v)) {
					t.Fatalf("a value of %d bytes reached the store: key %q", len(v), q.Key)
				}
			}
		}
	})
}
