// Package server is the sluice application: it turns a Config into a
// running rate limiter. New opens the rules source (files and their
// watcher, or a rules database), the store, the decision service with its
// observers (metrics, heavy hitters and denial log, tracing, statsd) and
// binds every listener: Envoy's gRPC rate limit API and the HTTP API (or,
// with Config.Proxy, a reverse proxy), the ops listeners, the admin API
// and their TLS. Run serves until its context ends, then shuts down
// gracefully: the health checks turn unhealthy, calls in flight finish
// (for at most Config.ShutdownTimeout), and everything New opened is
// closed.
//
//	cfg := server.DefaultConfig()
//	cfg.Rules.Source = "rules.yaml"
//	srv, err := server.New(cfg)
//	if err != nil { ... }
//	err = srv.Run(ctx)
//
// cmd/sluice turns flags, SLUICE_ variables, Envoy ratelimit's variables
// and a config file into a Config; nothing else imports this package.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/store/stack"
	"github.com/sluicehq/sluice/transport/admin"
	"github.com/sluicehq/sluice/transport/httpapi"
	"github.com/sluicehq/sluice/transport/respond"
)

// Server is a configured sluice: New made it, Run serves it. It is not
// safe to call Run twice.
type Server struct {
	cfg      Config // with its defaults set
	log      *slog.Logger
	co       *core
	tls      tlsSetup
	ops      *httpapi.Ops
	opsSrv   *sideServers
	admin    http.Handler      // the admin API, or nil
	adminSrv *sideServers      // its listener, or nil
	tokens   *admin.TokensFile // the admin tokens file, or nil: adminTokens
	ui       http.Handler      // the dashboard's mux on a listener of its own, or nil
	uiSrv    *sideServers      // that listener, or nil
	front    front             // serve's decision APIs, or the proxy
	closed   bool
}

// front is what a Server serves besides the ops listeners and the admin
// API: serve's decision APIs, or the proxy.
type front interface {
	// start serves on the listeners New bound; each server goroutine sends
	// its end on errc, and start returns how many there are.
	start(errc chan<- error) int
	// listening logs where the front listens.
	listening()
	// failed logs that a server of the front failed, with err.
	failed(err error)
	// shutdown turns the health checks unhealthy and stops the servers,
	// waiting for calls in flight until ctx ends; errc and running are
	// start's. It returns the first error a server ended with.
	shutdown(ctx context.Context, errc <-chan error, running int) error
	// close releases what the front holds; for a front never started, its
	// listeners too.
	close() error
}

// New opens everything cfg names and binds its listeners, but serves
// nothing yet: Run does. A *ConfigError is a setting that cannot work. A
// Server never Run must be closed with Close.
func New(cfg Config) (_ *Server, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	if cfg.Proxy != nil {
		if err := checkUpstream(cfg.Proxy.Upstream); err != nil {
			return nil, err
		}
	}
	rw := respond.New(respond.Config{Headers: cfg.ResponseHeaders, RetryJitter: cfg.RetryJitter})
	names := []string{"grpc", "http", "ops", "admin", "ui"}
	if cfg.Proxy != nil {
		names = []string{"proxy", "ops", "admin", "ui"}
	}
	if s.tls, err = newTLS(cfg.TLS, names, s.log); err != nil {
		return nil, err
	}
	if s.co, err = newCore(cfg); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Close())
		}
	}()
	if cfg.Proxy != nil {
		f, err := newProxyFront(s, rw)
		if err != nil {
			return nil, err
		}
		s.front = f
	} else {
		f, err := newServeFront(s, rw)
		if err != nil {
			return nil, err
		}
		s.front = f
	}
	ctx := context.Background()
	if s.opsSrv, err = listenSide(ctx, "--ops-addr", cfg.OpsAddrs); err != nil {
		return nil, err
	}
	if err := s.newAdmin(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// newOps returns the ops handler: health, readiness and metrics.
func (s *Server) newOps(cfg httpapi.OpsConfig) error {
	ops, err := httpapi.NewOps(s.opsConfig(cfg))
	s.ops = ops
	return err
}

// opsConfig returns cfg with what every ops endpoint shows of the server
// set: its rules, mode, readiness, fail-mode decisions, metrics and
// regions.
func (s *Server) opsConfig(cfg httpapi.OpsConfig) httpapi.OpsConfig {
	co := s.co
	cfg.Rules, cfg.Mode, cfg.Ready, cfg.FailDecisions = co.rules.Current, co.mode, co.ready, co.failDecisions
	cfg.Gatherer, cfg.Regions = co.reg, readyRegions(co.stores)
	return cfg
}

// Run serves until ctx ends or a listener fails, then shuts down: the
// health checks turn unhealthy, the listeners close, calls in flight
// finish (for at most Config.ShutdownTimeout), and everything New opened
// is closed. It returns why a listener failed, or nil after ctx ended.
func (s *Server) Run(ctx context.Context) (err error) {
	defer func() { err = errors.Join(err, s.Close()) }()
	s.opsSrv.start(s.ops, s.tls.config("ops", httpProtos...), s.log)
	s.startAdmin()
	s.startUI()
	errc := make(chan error, 4) // a front runs at most three servers: two gRPC listeners and HTTP
	running := s.front.start(errc)
	s.front.listening()

	var serveErr error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", "timeout", s.cfg.ShutdownTimeout)
	case serveErr = <-errc:
		running--
		s.front.failed(serveErr)
	}
	s.ops.Drain()
	timeout := max(s.cfg.ShutdownTimeout, 0)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := s.front.shutdown(sctx, errc, running); serveErr == nil {
		serveErr = err
	}
	if err := s.opsSrv.shutdown(sctx); err != nil && serveErr == nil {
		serveErr = fmt.Errorf("serve ops: %w", err)
	}
	if s.uiSrv != nil {
		if err := s.uiSrv.shutdown(sctx); err != nil && serveErr == nil {
			serveErr = fmt.Errorf("serve the dashboard: %w", err)
		}
	}
	s.log.Info("stopped")
	return serveErr
}

// Reload reads the rules and the TLS certificates again now, as nginx
// does on SIGHUP (`sluice serve` calls it then): for a change the
// watchers cannot see (a file system without notifications, a file
// behind a symbolic link in another directory, a certificate replaced
// with the same size and time), or to have it done at a moment of one's
// choosing. A reload that fails keeps the rules or certificates in force
// and is logged; Reload returns why. It is safe to call while Run serves;
// once Run has begun to shut down, it fails.
func (s *Server) Reload(ctx context.Context) error {
	err := s.co.rules.Reload(ctx)
	if err != nil {
		s.log.Error("reload: the rules in force stay", "rules", stack.Redact(s.cfg.Rules.Source), "err", err)
	}
	if s.tls.loader != nil {
		if terr := s.tls.loader.Reload(); terr != nil {
			s.log.Error("reload: TLS certificates", "err", terr)
			err = errors.Join(err, terr)
		}
	}
	if err == nil {
		cur := s.co.rules.Current()
		s.log.Info("reloaded", "rules", stack.Redact(s.cfg.Rules.Source), "version", cur.Version(), "domains", cur.Domains(),
			"tls", s.tls.loader != nil)
	}
	return err
}

// Close releases everything New opened, for a Server that Run did not
// serve; Run closes its Server itself. A second Close does nothing.
func (s *Server) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	var err error
	if s.adminSrv != nil {
		err = s.adminSrv.shutdown(context.Background())
		s.adminSrv.close()
	}
	if s.uiSrv != nil {
		err = errors.Join(err, s.uiSrv.shutdown(context.Background()))
		s.uiSrv.close()
	}
	s.opsSrv.close()
	if s.front != nil {
		err = errors.Join(err, s.front.close())
	}
	return errors.Join(err, s.co.close())
}

// OpsAddrs returns the addresses the ops listeners are bound to.
func (s *Server) OpsAddrs() []string { return s.opsSrv.addrs }

// AdminAddr returns the address the admin API is bound to, or "" without
// one.
func (s *Server) AdminAddr() string {
	if s.adminSrv == nil {
		return ""
	}
	return strings.Join(s.adminSrv.addrs, ",")
}

// UIAddr returns the address of the dashboard's own listener, or ""
// without one.
func (s *Server) UIAddr() string {
	if s.uiSrv == nil {
		return ""
	}
	return strings.Join(s.uiSrv.addrs, ",")
}

// Mode returns where decisions come from now, as /readyz reports it.
func (s *Server) Mode() decide.Mode { return s.co.svc.Mode() }
