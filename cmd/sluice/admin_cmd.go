package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/filedb"
	"github.com/sluicehq/sluice/transport/admin"
)

// adminFlags are the flags of the admin API, of serve and proxy alike.
type adminFlags struct {
	addr     string
	tokens   string
	readOnly bool
}

func (a *adminFlags) register(fs *ff.FlagSet) {
	fs.StringVar(&a.addr, 0, "admin-addr", "127.0.0.1:8082", withEnv("admin-addr", "address of the admin API (rules, history, overrides), served when --admin-tokens is set; loopback by default"))
	fs.StringVar(&a.tokens, 0, "admin-tokens", "", withEnv("admin-tokens", "file of admin API tokens, one a line: NAME read|write SECRET (# comments); none: no admin API"))
	fs.BoolVar(&a.readOnly, 0, "admin-read-only", withEnv("admin-read-only", "the admin API reads and dry-runs only (a GitOps setup)"))
}

// startAdmin serves the admin API of co's rules on --admin-addr when
// --admin-tokens is set, over TLS when tlsc has the "admin" listener, and
// logs where; it returns nil servers otherwise. The caller shuts the
// servers down (stopAdmin).
func startAdmin(ctx context.Context, c coreFlags, co *core, tlsc tlsSetup, log *slog.Logger) (*opsServers, error) {
	a := c.admin
	if a.tokens == "" {
		return nil, nil
	}
	toks, err := admin.WatchTokens(a.tokens, func(err error) { log.Error("admin tokens file", "err", err) })
	if err != nil {
		return nil, usageError("--admin-tokens: %v", err)
	}
	db := co.rulesDB
	if db == nil { // says why the admin API cannot write these rules files
		if _, err := filedb.Open(c.rules, c.loader()); err != nil {
			return nil, usageError("--admin-tokens: %v", err)
		}
		return nil, usageError("--admin-tokens: the admin API cannot write rules %s", c.rules)
	}
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Loader: c.loader(), Check: co.stores.check, Log: log})
	if err != nil {
		return nil, err
	}
	h, err := admin.New(admin.Config{Backend: ed, Tokens: toks, ReadOnly: a.readOnly, Log: log, Registerer: co.reg})
	if err != nil {
		return nil, err
	}
	srv, err := startOps(ctx, a.addr, h, tlsc.config("admin", httpProtos...), log)
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	log.Info("admin API listening", "admin_addr", strings.Join(srv.addrs, ","), "read_only", a.readOnly)
	return srv, nil
}

// stopAdmin shuts down the admin API startAdmin started, if any, waiting
// for its calls until ctx ends.
func stopAdmin(ctx context.Context, srv *opsServers) error {
	if srv == nil {
		return nil
	}
	return srv.shutdown(ctx)
}
