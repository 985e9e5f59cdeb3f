package proxy_test

import (
	"log"
	"net/http"
	"net/url"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/transport/proxy"
)

// ExampleNew puts sluice in front of an application on 127.0.0.1:9000,
// with the sample rules and identity, queueing over-limit requests for up
// to half a second.
func ExampleNew() {
	set, err := rules.Load("examples/rules.yaml")
	if err != nil {
		log.Fatal(err)
	}
	idc, err := identity.Load("examples/nginx/identity.yaml")
	if err != nil {
		log.Fatal(err)
	}
	id, err := identity.New(idc, nil)
	if err != nil {
		log.Fatal(err)
	}
	store, err := memory.New(memory.DefaultConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	dc := decide.DefaultConfig()
	dc.Rules = func() *rules.Set { return set }
	dc.Store = store
	svc, err := decide.New(dc)
	if err != nil {
		log.Fatal(err)
	}
	cfg := proxy.DefaultConfig()
	cfg.Upstream = &url.URL{Scheme: "http", Host: "127.0.0.1:9000"}
	cfg.Identity, cfg.Decider = id, svc
	cfg.MaxDelay = 500 * time.Millisecond
	p, err := proxy.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	log.Fatal(http.ListenAndServe("127.0.0.1:8000", p))
}
