package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/shed"
	"github.com/sluicehq/sluice/store/stack"
	"github.com/sluicehq/sluice/transport/httpapi"
	"github.com/sluicehq/sluice/transport/proxy"
	"github.com/sluicehq/sluice/transport/respond"
)

// Serve and proxy are one Server with two fronts, not two types: they
// share the rules, the store, decide and its observers, the ops
// listeners, the admin API, TLS and the shutdown, and differ only in the
// listener in front (Config.Proxy chooses).

// proxyFront is `sluice proxy`'s front: a reverse proxy that limits
// requests before forwarding them.
type proxyFront struct {
	s       *Server
	p       *proxy.Proxy
	srv     *http.Server
	ln      net.Listener
	up      *url.URL
	started bool
}

// checkUpstream refuses an upstream that is not an http:// or https://
// URL.
func checkUpstream(upstream string) error {
	if upstream == "" {
		return configError("proxy: --upstream (or $SLUICE_UPSTREAM) is required")
	}
	up, err := url.Parse(upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return configError("proxy: --upstream %q: want an http:// or https:// URL", upstream)
	}
	return nil
}

// newProxyFront makes the proxy of s and binds its listener.
func newProxyFront(s *Server, rw *respond.Writer) (*proxyFront, error) {
	co, c, pc := s.co, s.cfg, *s.cfg.Proxy
	f := &proxyFront{s: s}
	f.up, _ = url.Parse(pc.Upstream) // checked by New
	id, err := newIdentity(c.Identity, pc.Domain, s.log, co.reg)
	if err != nil {
		return nil, err
	}
	cfg := proxy.DefaultConfig()
	cfg.Upstream, cfg.Identity, cfg.Decider, cfg.Respond, cfg.Logger = f.up, id, co.svc, rw, s.log
	cfg.MaxDelay, cfg.MaxWaiting = pc.MaxDelay, pc.MaxWaiting
	var shedStats func() shed.Stats // for /readyz, nil without a gate
	if pc.Shed {
		gate, err := shed.New(shed.Config{MaxWait: pc.MaxDelay, MaxWaiting: pc.MaxWaiting})
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		if err := metrics.Shed(co.reg, gate.Stats); err != nil {
			return nil, err
		}
		cfg.Shed, shedStats = gate, gate.Stats
	}
	if f.p, err = proxy.New(cfg); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if err := s.newOps(httpapi.OpsConfig{Shed: shedStats}); err != nil {
		return nil, errors.Join(err, f.p.Close())
	}
	if err := s.mountDashboard(s.ops); err != nil {
		return nil, errors.Join(err, f.p.Close())
	}
	if f.ln, err = listenTCP(context.Background(), "--listen", pc.Listen); err != nil {
		return nil, errors.Join(err, f.p.Close())
	}
	f.srv = &http.Server{
		Handler:           f.p,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    httpapi.MaxHeaderBytes, // 431 for more
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	return f, nil
}

func (f *proxyFront) start(errc chan<- error) int {
	f.started = true
	go func() {
		err := serveHTTP(f.srv, f.ln, f.s.tls.config("proxy", httpProtos...))
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("serve: %w", err)
		}
		errc <- err
	}()
	return 1
}

func (f *proxyFront) listening() {
	s := f.s
	s.log.Info("proxying", "listen", f.ln.Addr().String(), "ops_addr", strings.Join(s.opsSrv.addrs, ","), "tls", s.tls.loader != nil,
		"upstream", f.up.Redacted(), "store", stack.Redact(s.cfg.Store.URL))
}

func (f *proxyFront) failed(err error) {
	f.s.log.Error("proxy failed; shutting down", "err", err)
}

func (f *proxyFront) shutdown(ctx context.Context, errc <-chan error, running int) error {
	if running == 0 {
		return nil
	}
	if err := f.srv.Shutdown(ctx); err != nil {
		f.s.log.Warn("requests still in flight at the shutdown deadline; closing them", "err", err)
		f.srv.Close()
	}
	return <-errc
}

func (f *proxyFront) close() error {
	if !f.started {
		f.ln.Close()
	}
	return f.p.Close()
}
