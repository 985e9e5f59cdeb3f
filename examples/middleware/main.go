// Command middleware is a Go service that embeds sluice: its handler sits
// behind sluice's middleware, which limits per client IP and per user
// (X-User) by examples/rules.yaml and examples/nginx/identity.yaml, with
// the in-memory store and concurrency slots. From the repository's root:
//
//	go run ./examples/middleware
//	curl -i -H 'X-User: alice' http://127.0.0.1:8000/login   # the sixth in a minute gets 429
package main

import (
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

func main() {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	h, _, err := limited("examples/rules.yaml", "examples/nginx/identity.yaml", hello)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: "127.0.0.1:8000", Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// limited returns next behind sluice's middleware, deciding by the rules
// file and the identity file over a memory store, which it also returns
// for the caller to close when done.
func limited(rulesFile, identityFile string, next http.Handler) (http.Handler, *memory.Store, error) {
	set, err := rules.Load(rulesFile)
	if err != nil {
		return nil, nil, err
	}
	idc, err := identity.Load(identityFile)
	if err != nil {
		return nil, nil, err
	}
	id, err := identity.New(idc, nil)
	if err != nil {
		return nil, nil, err
	}
	store, err := memory.New(memory.DefaultConfig()) // redis.Open (store/redis) shares limits between instances
	if err != nil {
		return nil, nil, err
	}
	slots, err := admit.New(admit.DefaultConfig()) // the rules' concurrency limits: slots on this instance
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	dc := decide.DefaultConfig()
	dc.Rules, dc.Store, dc.Admit = func() *rules.Set { return set }, store, slots
	svc, err := decide.New(dc)
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	limit, err := middleware.New(middleware.Config{Identity: id, Decider: svc})
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	return limit(next), store, nil
}
