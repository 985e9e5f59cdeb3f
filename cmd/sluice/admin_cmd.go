package main

import (
	"context"
	"crypto/tls"
	"log/slog"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/filedb"
	"github.com/sluicehq/sluice/transport/admin"
)

// adminFlags are serve's flags of the admin API.
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

// startAdmin serves the admin API on --admin-addr when --admin-tokens is
// set; it returns nil servers otherwise.
func startAdmin(ctx context.Context, a adminFlags, co *core, c coreFlags, tc *tls.Config, log *slog.Logger) (*opsServers, error) {
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
	return startOps(ctx, a.addr, h, tc, log)
}
