package server

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/ui"
)

// handlerMux is where the dashboard's routes go: the HTTP API
// (*httpapi.Handler), the ops listener (*httpapi.Ops), or the dashboard's
// own listener (uiMux).
type handlerMux interface {
	Handle(pattern string, h http.Handler) error
}

// mountDashboard mounts /ui, GET /v1/top and GET /v1/keys/ where
// Config.UI says: on each of hs (the HTTP API, the ops listeners), on a
// listener of their own, or nowhere; behind the admin tokens with
// UI.Auth.
func (s *Server) mountDashboard(hs ...handlerMux) error {
	co, c := s.co, s.cfg.UI
	if c.Addr == NoAddr {
		return nil
	}
	uc := ui.Config{
		Rules:    co.rules.Current,
		Gatherer: co.reg,
		Mode:     co.mode,
		Observer: co.observer,
		Events:   co.events,
	}
	if c.Auth {
		toks, err := s.adminTokens()
		if err != nil {
			return err
		}
		uc.Authenticate = func(secret string) bool { _, ok := toks.Lookup(secret); return ok }
	}
	d, err := ui.New(uc)
	if err != nil {
		return err
	}
	if c.Addr != "" {
		mux := &uiMux{http.NewServeMux()}
		hs = []handlerMux{mux}
		if s.uiSrv, err = listenSide(context.Background(), "--ui-addr", []string{c.Addr}); err != nil {
			return err
		}
		s.ui = mux
	}
	top, keys := d.Guard(co.observer.TopHandler()), d.Guard(observe.KeysHandler(inspector(co.svc, co.stores)))
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.Handle("/ui", d), h.Handle("/ui/", d),
			h.Handle("GET /v1/top", top), h.Handle("GET /v1/keys/", keys))
	}
	return errors.Join(errs...)
}

// uiMux is the dashboard's own listener's mux.
type uiMux struct{ *http.ServeMux }

// Handle registers h for pattern.
func (m *uiMux) Handle(pattern string, h http.Handler) error {
	m.ServeMux.Handle(pattern, h)
	return nil
}

// startUI serves the dashboard on its own listener, if it has one, over
// TLS when the "ui" listener has it, and logs where.
func (s *Server) startUI() {
	if s.uiSrv == nil {
		return
	}
	s.uiSrv.start(s.ui, s.tls.config("ui", httpProtos...), s.log)
	s.log.Info("dashboard listening", "ui_addr", strings.Join(s.uiSrv.addrs, ","), "auth", s.cfg.UI.Auth)
}
