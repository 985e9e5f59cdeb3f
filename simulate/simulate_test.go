package simulate_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/simulate"
)

// boundary is the classic fixed window's flaw: 100 a minute, a burst of
// 100 just before the minute turns and another just after.
const boundary = "idle 59s; burst 100; idle 1s; burst 100; idle 5s"

func TestBoundaryBurst(t *testing.T) {
	t.Parallel()
	set, err := rules.Parse("r.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := simulate.Targets(set, sluice.SlidingWindow, sluice.TokenBucket)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 3 || ts[0].Limit.Algorithm != sluice.FixedWindow || ts[1].Limit.Algorithm != sluice.SlidingWindow {
		t.Fatalf("targets %+v, want fixed, sliding and token bucket", ts)
	}
	p, err := simulate.ParseTraffic(boundary)
	if err != nil {
		t.Fatal(err)
	}
	res := simulate.Run(p, ts)
	if res.Seconds != 65 || res.Requests != 200 {
		t.Fatalf("%d seconds, %d requests, want 65 (the trailing idle included) and 200", res.Seconds, res.Requests)
	}
	fixed, sliding := res.Series[0], res.Series[1]
	if fixed.Admitted[59] != 100 || fixed.Admitted[60] != 100 || fixed.MaxAdmittedWindow != 200 {
		t.Errorf("fixed window admitted %d then %d (%d in a minute), want 100, 100, 200", fixed.Admitted[59], fixed.Admitted[60], fixed.MaxAdmittedWindow)
	}
	if sliding.Admitted[59] != 100 || sliding.Admitted[60] > 2 || sliding.Denied[60] < 98 {
		t.Errorf("sliding window admitted %d then %d, denied %d, want 100 then at most 2", sliding.Admitted[59], sliding.Admitted[60], sliding.Denied[60])
	}
}

func TestParseTraffic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spec  string
		n     int
		last  time.Duration
		keys  int
		error string
	}{
		{spec: "steady 10/s 2s", n: 20, last: 1900 * time.Millisecond, keys: 1},
		{spec: "steady 60/m 3s; burst 5", n: 8, last: 3 * time.Second, keys: 1},
		{spec: "clients 4; ramp 0/s 20/s 2s", n: 20, keys: 4},
		{spec: "idle 1s; burst 3", n: 3, last: time.Second, keys: 1},
		{spec: "steady 10/x 2s", error: "rate"},
		{spec: "steady 200000/s 1s", error: "rate"},
		{spec: "jump 3", error: "want steady"},
		{spec: "burst", error: "want 2 words"},
		{spec: "idle 25h", error: "duration"},
		{spec: "idle 1s", error: "no requests"},
		{spec: "clients 20000", error: "at most"},
		{spec: strings.Repeat("burst 1;", 600), error: "longer than"},
		{spec: "burst 1000000; burst 1", error: "more than"},
	} {
		p, err := simulate.ParseTraffic(tc.spec)
		evs := p.Events
		if tc.error != "" {
			if err == nil || !errors.Is(err, simulate.ErrSpec) || !strings.Contains(err.Error(), tc.error) {
				t.Errorf("%q: %v, want an error with %q", tc.spec, err, tc.error)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		keys := map[string]bool{}
		for _, e := range evs {
			keys[e.Key] = true
		}
		if len(evs) != tc.n || len(keys) != tc.keys || (tc.last != 0 && evs[len(evs)-1].At != tc.last) {
			t.Errorf("%q: %d events over %d keys, last at %v; want %d, %d, %v", tc.spec, len(evs), len(keys), evs[len(evs)-1].At, tc.n, tc.keys, tc.last)
		}
	}
}

func TestParseLog(t *testing.T) {
	t.Parallel()
	p, err := simulate.ParseLog(strings.NewReader("# t key\n1.5 alice\n0.25,bob\n\n2\n"))
	if err != nil {
		t.Fatal(err)
	}
	evs := p.Events
	if p.Length != 2*time.Second {
		t.Errorf("length %v, want 2s", p.Length)
	}
	want := []simulate.Event{{250 * time.Millisecond, "bob"}, {1500 * time.Millisecond, "alice"}, {2 * time.Second, "client-1"}}
	if len(evs) != 3 || evs[0] != want[0] || evs[1] != want[1] || evs[2] != want[2] {
		t.Errorf("%v, want %v", evs, want)
	}
	for _, bad := range []string{"x alice", "-1", "99999999", "", strings.Repeat("9", 5000)} {
		if _, err := simulate.ParseLog(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseTraffic(f *testing.F) {
	for _, s := range []string{boundary, "clients 3; ramp 0/s 5/s 3s", "steady 1/h 2h", "burst 0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		p, err := simulate.ParseTraffic(spec)
		evs := p.Events
		if err != nil {
			if !errors.Is(err, simulate.ErrSpec) {
				t.Fatalf("%q: error %v does not wrap ErrSpec", spec, err)
			}
			return
		}
		if len(evs) == 0 || len(evs) > simulate.MaxEvents || p.Length < evs[len(evs)-1].At || p.Length > simulate.MaxDuration {
			t.Fatalf("%q: %d events, length %v", spec, len(evs), p.Length)
		}
		for i := 1; i < len(evs); i++ {
			if evs[i].At < evs[i-1].At || evs[i].At > simulate.MaxDuration {
				t.Fatalf("%q: events out of order or too late at %d", spec, i)
			}
		}
	})
}

func FuzzParseLog(f *testing.F) {
	f.Add("1 a\n2,b\n")
	f.Add("# c\n0.5\n")
	f.Fuzz(func(t *testing.T, log string) {
		p, err := simulate.ParseLog(strings.NewReader(log))
		if err == nil && len(p.Events) == 0 {
			t.Fatal("no events and no error")
		}
	})
}

// TestReached: the example rules under ten clients at 1 a second each for
// a minute: the limits that traffic reaches (1 message a second, 5 logins
// a minute, ...) are charted, with their comparisons; those it never
// comes near (100 a second per address, 10,000 a day per key) are not, and the SVG report lists them instead of a panel each (issue 24.4:
// the report of the shipped rules was a chart per limit, mostly empty).
func TestReached(t *testing.T) {
	t.Parallel()
	set, err := rules.Load("../examples/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := simulate.Targets(set, sluice.SlidingWindow)
	if err != nil {
		t.Fatal(err)
	}
	p, err := simulate.ParseTraffic("clients 10; steady 10/s 60s")
	if err != nil {
		t.Fatal(err)
	}
	res := simulate.Run(p, ts)
	var reached, others []string
	for _, s := range res.Series {
		if s.Reached {
			reached = append(reached, s.Name)
		} else {
			others = append(others, s.Name)
		}
	}
	wantOthers := []string{
		"api.remote_address 100/1s", "api.remote_address 100/1s sliding_window",
		"api.user 30/1s token_bucket burst=100", "api.user 30/1s sliding_window",
		"api.user.api_messages.send 100/5m0s sliding_window",
		"api.user.path_/search 110/1m0s", "api.user.path_/search 110/1m0s sliding_window",
		"api.user.path_/export 150/24h0m0s", "api.user.path_/export 150/24h0m0s sliding_window",
		"api.api_key 10000/24h0m0s", "api.api_key 10000/24h0m0s sliding_window",
		"api.api_key.plan_pro* 1000/1m0s", "api.api_key.plan_pro* 1000/1m0s sliding_window",
	}
	if strings.Join(others, "|") != strings.Join(wantOthers, "|") {
		t.Errorf("not reached:\n%s\nwant:\n%s\n(reached: %s)", strings.Join(others, "\n"), strings.Join(wantOthers, "\n"), strings.Join(reached, ", "))
	}
	if len(reached) != len(res.Series)-len(wantOthers) || len(reached) == 0 {
		t.Errorf("reached %d of %d: %s", len(reached), len(res.Series), reached)
	}

	var buf bytes.Buffer
	if err := simulate.WriteSVG(&buf, "ten users", res); err != nil {
		t.Fatal(err)
	}
	var doc svgDoc
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Groups) != len(reached) {
		t.Errorf("%d panels, want one for each of the %d limits reached", len(doc.Groups), len(reached))
	}
	if !strings.Contains(buf.String(), "api.api_key 10000/24h0m0s (most in a period 600)") {
		t.Errorf("the SVG does not list the limits not reached:\n%.2000s", buf.String())
	}

	// A traffic that reaches nothing charts nothing and says so.
	set, err = rules.Parse("r.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ts, err = simulate.Targets(set, sluice.SlidingWindow); err != nil {
		t.Fatal(err)
	}
	if p, err = simulate.ParseTraffic("steady 1/s 10m"); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if err := simulate.WriteSVG(&buf, "slow", simulate.Run(p, ts)); err != nil {
		t.Fatal(err)
	}
	doc = svgDoc{}
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil || len(doc.Groups) != 0 || !strings.Contains(buf.String(), "The traffic reached no limit") {
		t.Errorf("a traffic that reaches nothing: %d panels, %v:\n%.500s", len(doc.Groups), err, buf.String())
	}
}

func TestStepFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ seconds, step int }{
		{1, 1}, {61, 1}, {120, 1}, {121, 2}, {600, 5}, {3600, 30}, {86400, 900}, {7 * 86400, 7200}, {30 * 86400, 21600},
	} {
		if got := simulate.StepFor(tc.seconds); got != tc.step || (tc.seconds+got-1)/got > simulate.MaxColumns {
			t.Errorf("StepFor(%d) = %d, want %d", tc.seconds, got, tc.step)
		}
	}
}
