package observe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// TestUnknownDomains: the first request for a domain no rules define is
// logged at WARN with the domain, once per domain; known domains are not.
func TestUnknownDomains(t *testing.T) {
	t.Parallel()
	set, err := rules.Parse("rules.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New(memory.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	var buf bytes.Buffer
	u := observe.NewUnknownDomains(slog.New(slog.NewJSONHandler(&buf, nil)))
	dc := decide.DefaultConfig()
	dc.Rules = func() *rules.Set { return set }
	dc.Store = mem
	dc.Logger = slog.New(slog.DiscardHandler)
	dc.Observers = []decide.Observer{u}
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"apl", "api", "apl", "other", "api", "other", "apl"} {
		resp, err := svc.Decide(context.Background(), req(d, "user", "alice"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.UnknownDomain != (d != "api") {
			t.Fatalf("%s: UnknownDomain %v", d, resp.UnknownDomain)
		}
	}
	var got []string
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var line struct {
			Level, Msg, Domain string
		}
		if err := dec.Decode(&line); err != nil {
			t.Fatal(err)
		}
		if line.Level != "WARN" {
			t.Errorf("%+v: level %s, want WARN", line, line.Level)
		}
		got = append(got, line.Domain)
	}
	if len(got) != 2 || got[0] != "apl" || got[1] != "other" {
		t.Errorf("logged domains %q, want [apl other]", got)
	}
}

// TestUnknownDomainsCap: past MaxUnknownDomains domains, one line says no
// more are logged, and none are.
func TestUnknownDomainsCap(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	u := observe.NewUnknownDomains(slog.New(slog.NewTextHandler(&buf, nil)))
	unknown := &decide.Response{UnknownDomain: true}
	for i := range observe.MaxUnknownDomains + 10 {
		u.Observe(context.Background(), &decide.Request{Domain: "d" + strconv.Itoa(i)}, unknown, nil)
	}
	u.Observe(context.Background(), &decide.Request{Domain: "known"}, &decide.Response{}, nil)
	u.Observe(context.Background(), &decide.Request{Domain: "bad"}, nil, errors.New("invalid request"))
	if n := bytes.Count(buf.Bytes(), []byte("\n")); n != observe.MaxUnknownDomains+1 {
		t.Errorf("%d lines, want %d", n, observe.MaxUnknownDomains+1)
	}
	if !bytes.Contains(buf.Bytes(), []byte("no more are logged")) {
		t.Error("no line says that no more are logged")
	}
}
