package server

import (
	"context"
	"strings"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/filedb"
	"github.com/sluicehq/sluice/transport/admin"
)

// newAdmin makes the admin API of the rules and binds its listener when
// Config.Admin.Tokens is set; without it there is no admin API.
func (s *Server) newAdmin(ctx context.Context) error {
	a := s.cfg.Admin
	if a.Tokens == "" {
		return nil
	}
	if isXDS(s.cfg.Rules.Source) {
		return configError("--admin-tokens: rules from an xDS server change there (Envoy Gateway's BackendTrafficPolicy), not through the admin API")
	}
	toks, err := s.adminTokens()
	if err != nil {
		return err
	}
	db := s.co.rulesDB
	if db == nil { // says why the admin API cannot write these rules files
		if _, err := filedb.Open(s.cfg.Rules.Source, s.cfg.Rules.Loader()); err != nil {
			return configError("--admin-tokens: %v", err)
		}
		return configError("--admin-tokens: the admin API cannot write rules %s", s.cfg.Rules.Source)
	}
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Loader: s.cfg.Rules.Loader(), Check: s.co.stores.CheckLimit, Log: s.log})
	if err != nil {
		return err
	}
	if s.admin, err = admin.New(admin.Config{Backend: ed, Tokens: toks, ReadOnly: a.ReadOnly, Log: s.log, Registerer: s.co.reg}); err != nil {
		return err
	}
	if s.adminSrv, err = listenSide(ctx, "--admin-addr", []string{a.Addr}); err != nil {
		return err
	}
	return nil
}

// adminTokens returns the admin tokens file, read once for the admin API
// and the dashboard.
func (s *Server) adminTokens() (*admin.TokensFile, error) {
	if s.tokens != nil {
		return s.tokens, nil
	}
	toks, err := admin.WatchTokens(s.cfg.Admin.Tokens, func(err error) { s.log.Error("admin tokens file", "err", err) })
	if err != nil {
		return nil, configError("--admin-tokens: %v", err)
	}
	s.tokens = toks
	return toks, nil
}

// startAdmin serves the admin API, if any, over TLS when the "admin"
// listener has it, and logs where.
func (s *Server) startAdmin() {
	if s.adminSrv == nil {
		return
	}
	s.adminSrv.start(s.admin, s.tls.config("admin", httpProtos...), s.log)
	s.log.Info("admin API listening", "admin_addr", strings.Join(s.adminSrv.addrs, ","), "read_only", s.cfg.Admin.ReadOnly)
}
