package decide_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// admitFunc is a decide.Admitter of a function.
type admitFunc func(ctx context.Context, r *decide.Request, resp *decide.Response)

func (f admitFunc) Admit(ctx context.Context, r *decide.Request, resp *decide.Response) {
	f(ctx, r, resp)
}

const admitRules = `
domain: api
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    concurrency: 1
`

// TestAdmitStep: Config.Admit is asked about the requests the rate limits
// allow, and only those; a Service without it leaves a concurrency limit
// alone and says so once at Warn, when a rule with one is first decided.
func TestAdmitStep(t *testing.T) {
	t.Parallel()
	set := loadRules(t, admitRules)
	ip := req("api", []string{"ip", "10.0.0.1"})
	user := req("api", []string{"user", "alice"})
	newSvc := func(t *testing.T, a decide.Admitter) (*decide.Service, *strings.Builder) {
		clk := newClock()
		var logs strings.Builder
		cfg := decide.DefaultConfig()
		cfg.Rules, cfg.Store, cfg.Now, cfg.Admit = func() *rules.Set { return set }, newMemory(t, clk), clk.Now, a
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		s, err := decide.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s, &logs
	}
	t.Run("without", func(t *testing.T) {
		s, logs := newSvc(t, nil)
		for i, want := range []decide.Code{decide.OK, decide.OverLimit} {
			if got := decideOK(t, s, ip).Overall; got != want {
				t.Fatalf("ip %d: %v, want %v", i, got, want)
			}
		}
		if logs.Len() != 0 {
			t.Fatalf("a warning before a concurrency limit was decided: %s", logs)
		}
		for i := range 3 {
			if got := decideOK(t, s, user).Overall; got != decide.OK {
				t.Fatalf("user %d: %v, want OK (no admit: the concurrency of 1 is left alone)", i, got)
			}
		}
		if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "key=user") {
			t.Fatalf("logged %q, want one warning naming the rule", logs)
		}
	})
	t.Run("with", func(t *testing.T) {
		var asked []string
		s, logs := newSvc(t, admitFunc(func(_ context.Context, r *decide.Request, resp *decide.Response) {
			asked = append(asked, r.Descriptors[0].Entries[0].Key)
			resp.Overall = decide.OverLimit
		}))
		decideOK(t, s, ip)
		decideOK(t, s, ip) // over the rate limit: not asked
		if got := decideOK(t, s, user).Overall; got != decide.OverLimit {
			t.Fatalf("user: %v, want the admitter's OverLimit", got)
		}
		if strings.Join(asked, ",") != "ip,user" || logs.Len() != 0 {
			t.Fatalf("asked %v and logged %q, want ip,user and nothing", asked, logs)
		}
	})
}
