package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"

	"github.com/sluicehq/sluice/store/stack"
	"github.com/sluicehq/sluice/transport/envoyrls"
	"github.com/sluicehq/sluice/transport/httpapi"
	"github.com/sluicehq/sluice/transport/respond"
)

// serveFront is `sluice serve`'s front: Envoy's gRPC rate limit API and
// the HTTP API, forward-auth and the dashboard on their listeners.
type serveFront struct {
	s     *Server
	rls   *envoyrls.Server
	api   *httpapi.Handler
	hsrv  *http.Server
	glns  []net.Listener // --grpc-addr's first, then --grpc-unix's
	hln   net.Listener
	gsrv  *grpc.Server // made by start
	ended bool         // listeners handed to their servers
}

// GRPCAddr returns the address the gRPC API is bound to, or "" with
// GRPCConfig.Addr NoAddr or a proxy.
func (s *Server) GRPCAddr() string {
	f, ok := s.front.(*serveFront)
	if !ok || s.cfg.GRPC.Addr == NoAddr {
		return ""
	}
	return f.glns[0].Addr().String()
}

// HTTPAddr returns the address the HTTP API (or the proxy) is bound to.
func (s *Server) HTTPAddr() string {
	switch f := s.front.(type) {
	case *serveFront:
		return f.hln.Addr().String()
	case *proxyFront:
		return f.ln.Addr().String()
	}
	return ""
}

// newServeFront makes the decision APIs of s and binds their listeners.
func newServeFront(s *Server, rw *respond.Writer) (*serveFront, error) {
	co, c := s.co, s.cfg
	f := &serveFront{s: s, rls: envoyrls.New(co.svc, envoyrls.Config{Respond: rw})}
	var err error
	f.api, err = httpapi.New(httpapi.Config{
		RateLimiter:  f.rls,
		Rules:        co.rules.Current,
		Ops:          s.opsConfig(httpapi.OpsConfig{}),
		MaxBodyBytes: httpapi.DefaultConfig().MaxBodyBytes,
	})
	if err != nil {
		return nil, err
	}
	if err := s.newOps(httpapi.OpsConfig{}); err != nil {
		return nil, err
	}
	if err := s.mountDashboard(f.api, s.ops); err != nil {
		return nil, err
	}
	if err := mountEnvoyDebug(s.ops, co.rules.Current, co.m, c.Envoy.Metrics, c.HTTP.Pprof || c.OpsPprof); err != nil { // Envoy's debug port
		return nil, err
	}
	if c.Identity != "" {
		// Forward-auth for nginx auth_request and Traefik ForwardAuth.
		fa, err := newForwardAuth(c.Identity, rw, co.svc, s.log, co.reg)
		if err != nil {
			return nil, err
		}
		if err := f.api.Handle("/v1/auth", fa); err != nil {
			return nil, err
		}
	}
	switch {
	case c.HTTP.Pprof:
		if err := mountPprof(f.api, s.ops); err != nil {
			return nil, err
		}
	case c.OpsPprof:
		if err := mountPprof(s.ops); err != nil {
			return nil, err
		}
	}
	f.hsrv = &http.Server{
		Handler:           f.api,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    httpapi.MaxHeaderBytes, // 431 for more
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	ctx := context.Background()
	if f.glns, err = listenGRPC(ctx, c.GRPC); err != nil {
		return nil, err
	}
	if f.hln, err = listenTCP(ctx, "--http-addr", c.HTTP.Addr); err != nil {
		closeAll(f.glns)
		return nil, err
	}
	return f, nil
}

// mountPprof serves Go's profiles under /debug/pprof/ on each of hs.
func mountPprof(hs ...handlerMux) error {
	var errs []error
	for pattern, h := range map[string]http.Handler{
		"GET /debug/pprof/":        http.HandlerFunc(pprof.Index),
		"GET /debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
		"GET /debug/pprof/profile": http.HandlerFunc(pprof.Profile),
		"GET /debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
		"GET /debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
	} {
		for _, mux := range hs {
			errs = append(errs, mux.Handle(pattern, h))
		}
	}
	return errors.Join(errs...)
}

// grpcOptions returns the gRPC server's options for c and its TLS, with
// sh watching the calls if not nil.
func grpcOptions(c GRPCConfig, t tlsSetup, sh stats.Handler) []grpc.ServerOption {
	opts := envoyrls.ServerOptions() // requests up to envoyrls.MaxRequestBytes; InvalidArgument for undecodable ones
	if sh != nil {
		opts = append(opts, grpc.StatsHandler(sh)) // Envoy's server stats
	}
	if c.MaxConnectionAge > 0 {
		// A zero grace is gRPC's default: no bound.
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge: c.MaxConnectionAge, MaxConnectionAgeGrace: max(c.MaxConnectionAgeGrace, 0)}))
	}
	if tc := t.config("grpc", "h2"); tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	return append(opts,
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// A fixed pool of workers serves the calls instead of a new
		// goroutine per call, whose stack grows anew each time. A call
		// holds its worker while the store answers (a Redis round trip),
		// and a call that finds every worker busy gets a new goroutine, so
		// the pool covers the calls in flight, not just the CPUs: on Redis,
		// with GOMAXPROCS workers, growing those stacks took 6.6% of the
		// server's CPU.
		grpc.NumStreamWorkers(uint32(max(64, runtime.GOMAXPROCS(0)))),
	)
}

func (f *serveFront) start(errc chan<- error) int {
	// The gRPC server starts its workers when made: made only once
	// nothing can fail before it serves, so that it is always stopped.
	var sh stats.Handler
	if f.s.co.envoyGRPC != nil {
		sh = f.s.co.envoyGRPC
	}
	f.gsrv = grpc.NewServer(grpcOptions(f.s.cfg.GRPC, f.s.tls, sh)...)
	f.rls.Register(f.gsrv)
	if !f.s.cfg.GRPC.NoReflection {
		reflection.Register(f.gsrv)
	}
	f.ended = true
	for _, gln := range f.glns {
		go func() {
			// A shutdown that comes before Serve starts makes Serve return
			// ErrServerStopped: that is the stop we asked for, not a
			// failure. Stopping closes the listener (a unix socket's file
			// goes with it).
			if err := f.gsrv.Serve(gln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("serve gRPC on %s: %w", gln.Addr(), err)
				return
			}
			errc <- nil
		}()
	}
	go func() {
		if err := serveHTTP(f.hsrv, f.hln, f.s.tls.config("http", httpProtos...)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serve HTTP: %w", err)
			return
		}
		errc <- nil
	}()
	return 1 + len(f.glns)
}

func (f *serveFront) listening() {
	s := f.s
	s.log.Info("listening", "grpc_addr", s.GRPCAddr(), "grpc_unix", s.cfg.GRPC.Unix, "http_addr", f.hln.Addr().String(),
		"ops_addr", strings.Join(s.opsSrv.addrs, ","), "tls", s.tls.loader != nil,
		"store", stack.Redact(s.cfg.Store.URL), "fail", s.cfg.Fail.String())
}

func (f *serveFront) failed(err error) {
	f.s.log.Error("server failed; shutting down", "err", err)
}

func (f *serveFront) shutdown(ctx context.Context, errc <-chan error, running int) error {
	log := f.s.log
	f.rls.Shutdown()
	f.api.Drain()
	stopped := make(chan struct{})
	go func() {
		f.gsrv.GracefulStop()
		close(stopped)
	}()
	if err := f.hsrv.Shutdown(ctx); err != nil {
		log.Warn("HTTP calls still in flight at the shutdown deadline; closing them", "err", err)
		f.hsrv.Close()
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		log.Warn("gRPC calls still in flight at the shutdown deadline; closing them")
		f.gsrv.Stop()
		<-stopped
	}
	var first error
	for ; running > 0; running-- {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (f *serveFront) close() error {
	if !f.ended {
		closeAll(f.glns)
		if f.hln != nil {
			f.hln.Close()
		}
	}
	return nil
}
