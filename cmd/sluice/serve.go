package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/transport/envoyrls"
	"github.com/sluicehq/sluice/transport/httpapi"
)

// serveConfig is what `sluice serve` is told by flags and environment.
type serveConfig struct {
	coreFlags
	grpcAddr        string
	grpcUnix        string   // a unix socket's path, or "" for none
	grpcUnixMode    fileMode // its permissions
	httpAddr        string
	identity        string
	headers         string
	retryJitter     time.Duration
	shutdownTimeout time.Duration
	reflection      bool
	pprof           bool
	connAge         connAgeFlags // gRPC connections' lifetime
}

func serveCommand(stderr io.Writer) *ff.Command {
	c := serveConfig{grpcUnixMode: 0o660} // the owner and its group may connect
	fs := ff.NewFlagSet("serve")
	fs.StringVar(&c.grpcAddr, 0, "grpc-addr", "127.0.0.1:8081", withEnv("grpc-addr", "address of Envoy's gRPC rate limit API; port 0 picks a free port; empty: none (with --grpc-unix)"))
	fs.StringVar(&c.grpcUnix, 0, "grpc-unix", "", withEnv("grpc-unix", "path of a unix domain socket on which to serve the gRPC API too (a stale socket there is replaced)"))
	fs.Value(0, "grpc-unix-mode", &c.grpcUnixMode, withEnv("grpc-unix-mode", "permissions of --grpc-unix's socket, in octal"))
	fs.StringVar(&c.httpAddr, 0, "http-addr", "127.0.0.1:8080", withEnv("http-addr", "address of the HTTP API; port 0 picks a free port"))
	c.coreFlags.register(fs)
	c.connAge.register(fs)
	fs.StringVar(&c.identity, 0, "identity", "", withEnv("identity", "identity file (Envoy rate_limits actions): serves forward-auth on GET /v1/auth"))
	fs.StringVar(&c.headers, 0, "response-headers", "all", withEnv("response-headers", headersUsage))
	fs.DurationVar(&c.retryJitter, 0, "retry-jitter", time.Second, withEnv("retry-jitter", "most random time added to Retry-After, in whole seconds"))
	fs.DurationVar(&c.shutdownTimeout, 0, "shutdown-timeout", 10*time.Second, withEnv("shutdown-timeout", "how long a shutdown waits for calls in flight"))
	fs.BoolVarDefault(&c.reflection, 0, "grpc-reflection", true, withEnv("grpc-reflection", "serve gRPC server reflection (for grpcurl and ghz)"))
	fs.BoolVarDefault(&c.pprof, 0, "pprof", false, withEnv("pprof", "serve Go's profiles under /debug/pprof/ on the HTTP address"))
	return &ff.Command{
		Name:      "serve",
		Usage:     "sluice serve --rules FILE|DIR [FLAGS]",
		ShortHelp: "answer Envoy's gRPC rate limit API and the HTTP API",
		LongHelp: "Serves envoy.service.ratelimit.v3.RateLimitService on --grpc-addr and, on --http-addr,\n" +
			"POST /v1/decide, POST /json, GET /healthz, /readyz, /healthcheck, /v1/rules, /metrics, the dashboard at /ui,\n" +
			"the heavy hitters at /v1/top and one client's state at /v1/keys/DOMAIN/KEY/VALUE.\n" +
			"The rules are reloaded when their files change; a broken edit keeps the rules in force.\n" +
			"SIGINT or SIGTERM stops accepting calls and finishes those in flight.",
		Flags: fs,
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usageError("serve: unexpected arguments %q", args)
			}
			return serve(ctx, c, stderr)
		},
	}
}

// newLogger returns the logger for level and format ("text" or "json").
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError("--log-format %q: want text or json", format)
}

// serve runs the server until ctx is cancelled, then shuts it down
// gracefully: the health services turn unhealthy, the listeners close,
// calls in flight finish (for at most --shutdown-timeout), and the rules
// watcher and store stop.
func serve(ctx context.Context, c serveConfig, stderr io.Writer) (err error) {
	log, err := newLogger(stderr, c.logLevel, c.logFormat)
	if err != nil {
		return err
	}
	rw, err := newResponder(c.headers, c.retryJitter)
	if err != nil {
		return err
	}
	tlsc, err := c.net.tls([]string{"grpc", "http", "ops", "admin"}, log)
	if err != nil {
		return err
	}

	co, err := newCore(log, c.coreFlags)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, co.close()) }()
	decider := co.decider
	rls := envoyrls.New(decider, envoyrls.Config{Respond: rw})
	api, err := httpapi.New(httpapi.Config{
		RateLimiter:  rls,
		Rules:        co.watcher.Current,
		Mode:         func() string { return decider.Mode().String() },
		Gatherer:     co.reg,
		MaxBodyBytes: httpapi.DefaultConfig().MaxBodyBytes,
	})
	if err != nil {
		return err
	}

	ops, err := httpapi.NewOps(httpapi.OpsConfig{
		Rules:    co.watcher.Current,
		Mode:     func() string { return decider.Mode().String() },
		Gatherer: co.reg,
	})
	if err != nil {
		return err
	}

	if err := co.mountDashboard(api, ops); err != nil {
		return err
	}

	if c.identity != "" {
		// Forward-auth for nginx auth_request and Traefik ForwardAuth.
		fa, err := newForwardAuth(c.identity, rw, decider, log, co.reg)
		if err != nil {
			return err
		}
		if err := api.Handle("/v1/auth", fa); err != nil {
			return err
		}
	}

	if c.pprof {
		for pattern, h := range map[string]http.Handler{
			"GET /debug/pprof/":        http.HandlerFunc(pprof.Index),
			"GET /debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
			"GET /debug/pprof/profile": http.HandlerFunc(pprof.Profile),
			"GET /debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
			"GET /debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
		} {
			if err := errors.Join(api.Handle(pattern, h), ops.Handle(pattern, h)); err != nil {
				return err
			}
		}
	}

	hsrv := &http.Server{
		Handler:           api,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    httpapi.MaxHeaderBytes, // 431 for more
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}

	glns, err := listenGRPC(ctx, c)
	if err != nil {
		return err
	}
	closeGRPC := func() {
		for _, ln := range glns {
			ln.Close()
		}
	}
	var lc net.ListenConfig
	hln, err := lc.Listen(ctx, "tcp", c.httpAddr)
	if err != nil {
		closeGRPC()
		return fmt.Errorf("listen HTTP: %w", err)
	}
	opsSrv, err := startOps(ctx, c.net.opsAddr, ops, tlsc.config("ops", httpProtos...), log)
	if err != nil {
		closeGRPC()
		hln.Close()
		return err
	}
	adminSrv, err := startAdmin(ctx, c.coreFlags, co, tlsc, log)
	if err != nil {
		closeGRPC()
		hln.Close()
		return errors.Join(err, opsSrv.shutdown(ctx))
	}
	defer stopAdmin(context.WithoutCancel(ctx), adminSrv)
	gopts := c.connAge.options()
	if tc := tlsc.config("grpc", "h2"); tc != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tc)))
	}
	// The gRPC server starts its workers when made: made only once
	// nothing can fail before it serves, so that it is always stopped.
	gsrv := grpc.NewServer(append(append(envoyrls.ServerOptions(), gopts...), // requests up to envoyrls.MaxRequestBytes; InvalidArgument for undecodable ones
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// A fixed pool of workers serves the calls instead of a new
		// goroutine per call, whose stack grows anew each time. A call
		// holds its worker while the store answers (a Redis round trip),
		// and a call that finds every worker busy gets a new goroutine, so
		// the pool covers the calls in flight, not just the CPUs: on Redis,
		// with GOMAXPROCS workers, growing those stacks took 6.6% of the
		// server's CPU.
		grpc.NumStreamWorkers(uint32(max(64, runtime.GOMAXPROCS(0)))),
	)...)
	rls.Register(gsrv)
	if c.reflection {
		reflection.Register(gsrv)
	}
	grpcAddr := ""
	if c.grpcAddr != "" {
		grpcAddr = glns[0].Addr().String()
	}
	log.Info("listening", "grpc_addr", grpcAddr, "grpc_unix", c.grpcUnix, "http_addr", hln.Addr().String(),
		"ops_addr", strings.Join(opsSrv.addrs, ","), "tls", tlsc.loader != nil,
		"store", redactURL(c.store), "fail", c.fail)

	errc := make(chan error, 1+len(glns))
	for _, gln := range glns {
		go func() {
			// A shutdown that comes before Serve starts makes Serve return
			// ErrServerStopped: that is the stop we asked for, not a
			// failure. Stopping closes the listener (a unix socket's file
			// goes with it).
			if err := gsrv.Serve(gln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("serve gRPC on %s: %w", gln.Addr(), err)
				return
			}
			errc <- nil
		}()
	}
	go func() {
		if err := serveHTTP(hsrv, hln, tlsc.config("http", httpProtos...)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serve HTTP: %w", err)
			return
		}
		errc <- nil
	}()

	var serveErr error
	running := 1 + len(glns)
	select {
	case <-ctx.Done():
		log.Info("shutting down", "timeout", c.shutdownTimeout)
	case serveErr = <-errc:
		running--
		log.Error("server failed; shutting down", "err", serveErr)
	}

	rls.Shutdown()
	api.Drain()
	ops.Drain()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.shutdownTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		gsrv.GracefulStop()
		close(stopped)
	}()
	if err := hsrv.Shutdown(sctx); err != nil {
		log.Warn("HTTP calls still in flight at the shutdown deadline; closing them", "err", err)
		hsrv.Close()
	}
	if err := opsSrv.shutdown(sctx); err != nil && serveErr == nil {
		serveErr = fmt.Errorf("serve ops: %w", err)
	}
	select {
	case <-stopped:
	case <-sctx.Done():
		log.Warn("gRPC calls still in flight at the shutdown deadline; closing them")
		gsrv.Stop()
		<-stopped
	}
	for ; running > 0; running-- {
		if err := <-errc; err != nil && serveErr == nil {
			serveErr = err
		}
	}
	log.Info("stopped")
	return serveErr
}

// listenGRPC opens the gRPC listeners c asks for: --grpc-addr's (first)
// and --grpc-unix's, at least one.
func listenGRPC(ctx context.Context, c serveConfig) ([]net.Listener, error) {
	if c.grpcAddr == "" && c.grpcUnix == "" {
		return nil, usageError("--grpc-addr and --grpc-unix are both empty: gRPC needs one of them")
	}
	var lns []net.Listener
	if c.grpcAddr != "" {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", c.grpcAddr)
		if err != nil {
			return nil, fmt.Errorf("listen gRPC: %w", err)
		}
		lns = append(lns, ln)
	}
	if c.grpcUnix != "" {
		ln, err := listenUnix(ctx, c.grpcUnix, fs.FileMode(c.grpcUnixMode))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("gRPC: %w", err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}
