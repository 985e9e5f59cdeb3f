package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/server"
)

func serveCommand(stderr io.Writer) *ff.Command { return serveCommandOf(newSettings(forServe), stderr) }

func proxyCommand(stderr io.Writer) *ff.Command { return proxyCommandOf(newSettings(forProxy), stderr) }

// serveCommandOf is `sluice serve`, whose flags set s.
func serveCommandOf(s *settings, stderr io.Writer) *ff.Command {
	fs := ff.NewFlagSet("serve")
	s.register(fs, forServe)
	return &ff.Command{
		Name:      "serve",
		Usage:     "sluice serve --rules FILE|DIR [FLAGS]",
		ShortHelp: "answer Envoy's gRPC rate limit API and the HTTP API",
		LongHelp: "Serves envoy.service.ratelimit.v3.RateLimitService on --grpc-addr and, on --http-addr,\n" +
			"POST /v1/decide, POST /json, GET /healthz, /readyz, /healthcheck, /v1/rules, /metrics, the dashboard at /ui,\n" +
			"the heavy hitters at /v1/top and one client's state at /v1/keys/DOMAIN/KEY/VALUE.\n" +
			"The rules are reloaded when their files change; a broken edit keeps the rules in force.\n" +
			"SIGHUP reloads the rules and the TLS certificates now (as nginx does), for changes not seen.\n" +
			"SIGINT or SIGTERM stops accepting calls and finishes those in flight.",
		Flags: fs,
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usageError("serve: unexpected arguments %q", args)
			}
			return runServer(ctx, s, stderr)
		},
	}
}

// proxyCommandOf is `sluice proxy`, whose flags set s.
func proxyCommandOf(s *settings, stderr io.Writer) *ff.Command {
	fs := ff.NewFlagSet("proxy")
	s.register(fs, forProxy)
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
			return runServer(ctx, s, stderr)
		},
	}
}

// runServer runs the server s configures until ctx is cancelled, logging
// to stderr. A setting the server refuses is a usage error.
func runServer(ctx context.Context, s *settings, stderr io.Writer) error {
	log, err := newLogger(stderr, s.logLevel, s.logFormat)
	if err != nil {
		return err
	}
	cfg := s.cfg
	cfg.Logger = log
	srv, err := server.New(cfg)
	if err == nil {
		stop := reloadOn(ctx, srv)
		err = srv.Run(ctx)
		stop()
	}
	var ce *server.ConfigError
	if errors.As(err, &ce) {
		return usageError("%v", err)
	}
	return err
}

// reloadsKey is the context key of the channel of SIGHUP, which main
// registers before anything else.
type reloadsKey struct{}

// withReloads returns ctx carrying sig, whose signals make serve and proxy
// reload (reloadOn).
func withReloads(ctx context.Context, sig <-chan os.Signal) context.Context {
	return context.WithValue(ctx, reloadsKey{}, sig)
}

// reloadOn reloads srv at each signal of the channel ctx carries, if any
// (withReloads), until ctx ends or stop is called; stop waits for a reload
// under way. Server.Reload logs each.
func reloadOn(ctx context.Context, srv *server.Server) (stop func()) {
	sig, _ := ctx.Value(reloadsKey{}).(<-chan os.Signal)
	if sig == nil {
		return func() {}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-sig:
				_ = srv.Reload(ctx) // logged by Reload
			}
		}
	}()
	return func() { close(done); <-stopped }
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
	case "envoy":
		opts.ReplaceAttr = envoyLogNames
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError("--log-format %q: want text, json or envoy", format)
}

// envoyLogLevels are the names Envoy ratelimit's JSON logs (logrus's) give
// slog's levels.
var envoyLogLevels = map[slog.Level]string{slog.LevelDebug: "debug", slog.LevelInfo: "info", slog.LevelWarn: "warning", slog.LevelError: "error"}

// envoyLogNames names a record's own fields as Envoy ratelimit's JSON logs
// do: @timestamp, @message, and level in logrus's words.
func envoyLogNames(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.TimeKey:
		a.Key = "@timestamp"
	case slog.MessageKey:
		a.Key = "@message"
	case slog.LevelKey:
		if lv, ok := a.Value.Any().(slog.Level); ok {
			if name, ok := envoyLogLevels[lv]; ok {
				a.Value = slog.StringValue(name)
			}
		}
	}
	return a
}
