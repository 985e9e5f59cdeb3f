package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
		"listeners that serve TLS: all, or a list of grpc, http, ops, admin (serve) or proxy, ops, admin (proxy)"))
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

// listenUnix listens on the unix domain socket at path, with the file's
// permissions set to mode before anything is served. A socket file that a
// process left behind (one nothing accepts on any more) is removed first;
// a socket another process still serves on, or a file that is not a
// socket, is refused. The listener removes the file when it is closed.
func listenUnix(ctx context.Context, path string, mode fs.FileMode) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("listen unix %s: %w", path, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("listen unix %s: the file exists and is not a socket", path)
	default:
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("listen unix %s: another process serves on it", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("listen unix %s: check the socket left there: %w", path, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("listen unix %s: remove the stale socket: %w", path, err)
		}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen unix: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen unix %s: %w", path, err)
	}
	return ln, nil
}

// fileMode is a flag value of file permissions written in octal: 660,
// 0660 or 0o660; at most 0777.
type fileMode fs.FileMode

func (m *fileMode) String() string { return fmt.Sprintf("%#o", uint32(*m)) }

func (m *fileMode) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O"), 8, 32)
	if err != nil || n > 0o777 {
		return fmt.Errorf("%q: want permissions in octal, such as 0660 (at most 0777)", s)
	}
	*m = fileMode(n)
	return nil
}
