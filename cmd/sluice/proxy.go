package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/shed"
	"github.com/sluicehq/sluice/transport/httpapi"
	"github.com/sluicehq/sluice/transport/proxy"
)

// proxyConfig is what `sluice proxy` is told by flags and environment.
type proxyConfig struct {
	coreFlags
	upstream        string
	listen          string
	identity        string
	domain          string
	headers         string
	retryJitter     time.Duration
	maxDelay        time.Duration
	maxWaiting      int
	shed            bool
	shutdownTimeout time.Duration
}

func proxyCommand(stderr io.Writer) *ff.Command {
	var c proxyConfig
	def := proxy.DefaultConfig()
	fs := ff.NewFlagSet("proxy")
	c.coreFlags.register(fs)
	fs.StringVar(&c.upstream, 0, "upstream", "", withEnv("upstream", "URL of the service behind the proxy (required)"))
	fs.StringVar(&c.listen, 0, "listen", "127.0.0.1:8000", withEnv("listen", "address the proxy listens on; port 0 picks a free port"))
	fs.StringVar(&c.identity, 0, "identity", "", withEnv("identity", "identity file (Envoy rate_limits actions); default: one limit per client IP"))
	fs.StringVar(&c.domain, 0, "domain", "api", withEnv("domain", "rules domain of the default per-IP identity (unused with --identity)"))
	fs.StringVar(&c.headers, 0, "response-headers", "all", withEnv("response-headers", headersUsage))
	fs.DurationVar(&c.retryJitter, 0, "retry-jitter", time.Second, withEnv("retry-jitter", "most random time added to Retry-After, in whole seconds"))
	fs.DurationVar(&c.maxDelay, 0, "max-delay", def.MaxDelay, withEnv("max-delay", "longest a request a leaky_bucket admits is held for its turn; one whose turn is further gets 429 at once (0: never hold)"))
	fs.IntVar(&c.maxWaiting, 0, "max-waiting", def.MaxWaiting, withEnv("max-waiting", "most requests waiting for their turn at once"))
	fs.BoolVar(&c.shed, 0, "shed", withEnv("shed", "adaptive load shedding: an adaptive limit on requests in flight to the upstream, which sheds by the rules' priority (503) when it is saturated; critical and default requests wait up to --max-delay (1s when 0) for a slot"))
	fs.DurationVar(&c.shutdownTimeout, 0, "shutdown-timeout", 10*time.Second, withEnv("shutdown-timeout", "how long a shutdown waits for requests in flight"))
	return &ff.Command{
		Name:      "proxy",
		Usage:     "sluice proxy --upstream URL --rules FILE|DIR [FLAGS]",
		ShortHelp: "a reverse proxy that limits requests before forwarding them",
		LongHelp: "Forwards allowed requests to --upstream and answers the others 429 Too Many Requests\n" +
			"with Retry-After and RateLimit headers; with --max-delay, over-limit requests wait for\n" +
			"their turn instead. Upstream failures give 502, upstream timeouts 504.",
		Flags: fs,
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usageError("proxy: unexpected arguments %q", args)
			}
			return runProxy(ctx, c, stderr)
		},
	}
}

// runProxy serves the proxy until ctx is cancelled, then finishes the
// requests in flight.
func runProxy(ctx context.Context, c proxyConfig, stderr io.Writer) (err error) {
	log, err := newLogger(stderr, c.logLevel, c.logFormat)
	if err != nil {
		return err
	}
	if c.upstream == "" {
		return usageError("proxy: --upstream (or $SLUICE_UPSTREAM) is required")
	}
	up, err := url.Parse(c.upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return usageError("proxy: --upstream %q: want an http:// or https:// URL", c.upstream)
	}
	id, err := newIdentity(c.identity, c.domain, log)
	if err != nil {
		return err
	}
	rw, err := newResponder(c.headers, c.retryJitter)
	if err != nil {
		return err
	}
	tlsc, err := c.net.tls([]string{"proxy", "ops", "admin"}, log)
	if err != nil {
		return err
	}
	co, err := newCore(log, c.coreFlags)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, co.close()) }()
	if err := identityMetrics(co.reg, id); err != nil {
		return err
	}

	pc := proxy.DefaultConfig()
	pc.Upstream, pc.Identity, pc.Decider, pc.Respond, pc.Logger = up, id, co.decider, rw, log
	pc.MaxDelay, pc.MaxWaiting = c.maxDelay, c.maxWaiting
	if c.shed {
		gate, err := shed.New(shed.Config{MaxWait: c.maxDelay, MaxWaiting: c.maxWaiting})
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		if err := metrics.Shed(co.reg, gate.Stats); err != nil {
			return err
		}
		pc.Shed = gate
	}
	p, err := proxy.New(pc)
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	defer p.Close()

	ops, err := httpapi.NewOps(httpapi.OpsConfig{
		Rules:    co.watcher.Current,
		Mode:     func() string { return co.decider.Mode().String() },
		Gatherer: co.reg,
		Shed:     shedStats(pc.Shed),
	})
	if err != nil {
		return err
	}

	if err := co.mountDashboard(ops); err != nil {
		return err
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	opsSrv, err := startOps(ctx, c.net.opsAddr, ops, tlsc.config("ops", httpProtos...), log)
	if err != nil {
		ln.Close()
		return err
	}
	adminSrv, err := startAdmin(ctx, c.coreFlags, co, tlsc, log)
	if err != nil {
		ln.Close()
		return errors.Join(err, opsSrv.shutdown(ctx))
	}
	defer stopAdmin(context.WithoutCancel(ctx), adminSrv)
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    httpapi.MaxHeaderBytes, // 431 for more
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("proxying", "listen", ln.Addr().String(), "ops_addr", strings.Join(opsSrv.addrs, ","), "tls", tlsc.loader != nil,
		"upstream", up.Redacted(), "store", redactURL(c.store))
	errc := make(chan error, 1)
	go func() { errc <- serveHTTP(srv, ln, tlsc.config("proxy", httpProtos...)) }()
	var serveErr error
	select {
	case serveErr = <-errc:
		serveErr = fmt.Errorf("serve: %w", serveErr)
		log.Error("proxy failed; shutting down", "err", serveErr)
	case <-ctx.Done():
		log.Info("shutting down", "timeout", c.shutdownTimeout)
	}
	ops.Drain()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.shutdownTimeout)
	defer cancel()
	if serveErr == nil {
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("requests still in flight at the shutdown deadline; closing them", "err", err)
			srv.Close()
		}
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			serveErr = fmt.Errorf("serve: %w", err)
		}
	}
	if err := opsSrv.shutdown(sctx); err != nil && serveErr == nil {
		serveErr = fmt.Errorf("serve ops: %w", err)
	}
	log.Info("stopped")
	return serveErr
}

// shedStats returns the Stats of gate for /readyz, nil without one.
func shedStats(gate *shed.Gate) func() shed.Stats {
	if gate == nil {
		return nil
	}
	return gate.Stats
}
