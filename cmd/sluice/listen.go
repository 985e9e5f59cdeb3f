package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/internal/tlsreload"
)

// listenFlags are the flags of serve's and proxy's listeners that are not
// their addresses: the ops listeners and TLS.
type listenFlags struct {
	opsAddr      string
	tlsCert      string
	tlsKey       string
	tlsClientCA  string
	tlsClientSAN string
	tlsListeners string
}

func (l *listenFlags) register(fs *ff.FlagSet) {
	fs.StringVar(&l.opsAddr, 0, "ops-addr", "", withEnv("ops-addr",
		"addresses (comma-separated) of listeners serving only /healthz, /readyz, /healthcheck and /metrics; none by default"))
	fs.StringVar(&l.tlsCert, 0, "tls-cert", "", withEnv("tls-cert", "PEM certificate chain: serve TLS (reloaded when the file changes)"))
	fs.StringVar(&l.tlsKey, 0, "tls-key", "", withEnv("tls-key", "PEM private key of --tls-cert"))
	fs.StringVar(&l.tlsClientCA, 0, "tls-client-ca", "", withEnv("tls-client-ca", "PEM CA bundle: require client certificates it signed (mutual TLS)"))
	fs.StringVar(&l.tlsClientSAN, 0, "tls-client-san", "", withEnv("tls-client-san", "a name (DNS, URI, IP or email) every client certificate must carry"))
	fs.StringVar(&l.tlsListeners, 0, "tls-listeners", "all", withEnv("tls-listeners",
		"listeners that serve TLS: all, or a list of grpc, http, ops (serve) or proxy, ops (proxy)"))
}

// tlsSetup is the TLS of one command's listeners: which serve it, and the
// certificates. The zero tlsSetup serves no TLS.
type tlsSetup struct {
	loader *tlsreload.Loader
	on     map[string]bool
}

// tls returns the TLS setup the flags ask for, for a command whose
// listeners are called names. Without --tls-cert there is none.
func (l listenFlags) tls(names []string, log *slog.Logger) (tlsSetup, error) {
	if l.tlsCert == "" && l.tlsKey == "" {
		if l.tlsClientCA != "" || l.tlsClientSAN != "" {
			return tlsSetup{}, usageError("--tls-client-ca and --tls-client-san need --tls-cert and --tls-key")
		}
		return tlsSetup{}, nil
	}
	on := map[string]bool{}
	for _, w := range strings.Split(l.tlsListeners, ",") {
		w = strings.TrimSpace(w)
		switch {
		case w == "all":
			for _, n := range names {
				on[n] = true
			}
		case slices.Contains(names, w):
			on[w] = true
		default:
			return tlsSetup{}, usageError("--tls-listeners %q: want all or a list of %s", l.tlsListeners, strings.Join(names, ", "))
		}
	}
	ld, err := tlsreload.New(tlsreload.Files{Cert: l.tlsCert, Key: l.tlsKey, ClientCA: l.tlsClientCA, ClientSAN: l.tlsClientSAN},
		func(err error) { log.Error("TLS certificates reload failed", "err", err) })
	if err != nil {
		return tlsSetup{}, usageError("%v", err)
	}
	return tlsSetup{loader: ld, on: on}, nil
}

// config returns the tls.Config of the listener called name, offering
// nextProtos, or nil when it serves no TLS.
func (t tlsSetup) config(name string, nextProtos ...string) *tls.Config {
	if t.loader == nil || !t.on[name] {
		return nil
	}
	return t.loader.Config(nextProtos...)
}

// httpProtos are the ALPN protocols of an HTTP listener.
var httpProtos = []string{"h2", "http/1.1"}

// serveHTTP serves srv on ln, over TLS when tc is not nil.
func serveHTTP(srv *http.Server, ln net.Listener, tc *tls.Config) error {
	if tc == nil {
		return srv.Serve(ln)
	}
	srv.TLSConfig = tc
	return srv.ServeTLS(ln, "", "")
}

// opsServers are the ops listeners of a process.
type opsServers struct {
	srvs  []*http.Server
	addrs []string
	errc  chan error
}

// startOps listens on every address of the comma-separated list addrs and
// serves h there, over TLS when tc is not nil. With no address it starts
// nothing. The caller calls shutdown.
func startOps(ctx context.Context, addrs string, h http.Handler, tc *tls.Config, log *slog.Logger) (*opsServers, error) {
	o := &opsServers{}
	var lns []net.Listener
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", a)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("listen ops %s: %w", a, err)
		}
		lns = append(lns, ln)
		o.addrs = append(o.addrs, ln.Addr().String())
	}
	o.errc = make(chan error, len(lns))
	for _, ln := range lns {
		srv := &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		o.srvs = append(o.srvs, srv)
		go func() {
			err := serveHTTP(srv, ln, tc)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			if err != nil {
				log.Error("ops listener failed", "addr", ln.Addr().String(), "err", err)
			}
			o.errc <- err
		}()
	}
	return o, nil
}

// shutdown stops the ops listeners, waiting for their requests until ctx
// ends, and returns the first error they failed with.
func (o *opsServers) shutdown(ctx context.Context) error {
	for _, s := range o.srvs {
		if s.Shutdown(ctx) != nil {
			s.Close()
		}
	}
	var err error
	for range o.srvs {
		err = errors.Join(err, <-o.errc)
	}
	return err
}
