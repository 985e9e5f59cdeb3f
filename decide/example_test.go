package decide_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

func ExampleService_Decide() {
	dir, err := os.MkdirTemp("", "rules")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	yaml := `
domain: api
descriptors:
  - key: user
    rate_limits:                 # both must pass
      - {unit: second, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 100}
`
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(yaml), 0o600); err != nil {
		fmt.Println(err)
		return
	}
	set, err := rules.Load(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	mcfg := memory.DefaultConfig()
	mcfg.Now = func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) } // a fixed clock
	store, err := memory.New(mcfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	cfg := decide.DefaultConfig()
	cfg.Rules = func() *rules.Set { return set } // a rules.Watcher's Current in a server
	cfg.Store = store
	svc, err := decide.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	r := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{
		{Entries: []decide.Entry{{Key: "user", Value: "alice"}}, Cost: 1},
	}}
	for range 3 {
		resp, err := svc.Decide(context.Background(), r)
		if err != nil {
			fmt.Println(err)
			return
		}
		st := resp.Statuses[0]
		fmt.Printf("%s: remaining=%d of %d per %s, retry after %v\n",
			resp.Overall, st.Decision.Remaining, st.Decision.Limit, st.Limit.Unit, st.Decision.RetryAfter)
	}
	// Output:
	// OK: remaining=1 of 2 per second, retry after 0s
	// OK: remaining=0 of 2 per second, retry after 0s
	// OVER_LIMIT: remaining=0 of 2 per second, retry after 1s
}
