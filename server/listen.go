package server

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
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/tlsreload"
)

// tlsSetup is the TLS of a server's listeners: which serve it, and the
// certificates. The zero tlsSetup serves no TLS.
type tlsSetup struct {
	loader *tlsreload.Loader
	on     map[string]bool
}

// newTLS returns the TLS setup c asks for, for a server whose listeners
// are called names. Without a certificate there is none.
func newTLS(c TLSConfig, names []string, log *slog.Logger) (tlsSetup, error) {
	if c.Cert == "" && c.Key == "" {
		if c.ClientCA != "" || c.ClientSAN != "" {
			return tlsSetup{}, configError("--tls-client-ca and --tls-client-san need --tls-cert and --tls-key")
		}
		return tlsSetup{}, nil
	}
	on := map[string]bool{}
	for _, w := range c.Listeners {
		w = strings.TrimSpace(w)
		switch {
		case w == "all":
			for _, n := range names {
				on[n] = true
			}
		case slices.Contains(names, w):
			on[w] = true
		default:
			return tlsSetup{}, configError("--tls-listeners %q: want all or a list of %s", strings.Join(c.Listeners, ","), strings.Join(names, ", "))
		}
	}
	ld, err := tlsreload.New(tlsreload.Files{Cert: c.Cert, Key: c.Key, ClientCA: c.ClientCA, ClientSAN: c.ClientSAN},
		func(err error) { log.Error("TLS certificates reload failed", "err", err) })
	if err != nil {
		return tlsSetup{}, configError("%v", err)
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

// listenTCP listens on addr, which the setting called flag (--http-addr)
// gives: its error names both, as the operator wrote them.
func listenTCP(ctx context.Context, flag, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, &ListenError{Flag: flag, Addr: addr, Err: err}
	}
	return ln, nil
}

// ListenError is a listener that could not be bound: the setting that
// names it (a flag, --http-addr), the address and why.
type ListenError struct {
	Flag, Addr string
	Err        error
}

// Error says the flag, the address and the system's reason alone
// ("--http-addr 127.0.0.1:8080: address already in use"), with what to do
// when the address is taken.
func (e *ListenError) Error() string {
	why := e.Err.Error()
	var se *os.SyscallError
	if errors.As(e.Err, &se) {
		why = se.Err.Error()
	}
	if errors.Is(e.Err, syscall.EADDRINUSE) {
		why += " (another process listens there: stop it, or give " + e.Flag + " another address)"
	}
	return e.Flag + " " + e.Addr + ": " + why
}

func (e *ListenError) Unwrap() error { return e.Err }

// sideServers are HTTP listeners beside the main ones (ops, admin): one
// handler on each of a list of addresses. A failure of one is logged and
// does not stop the others.
type sideServers struct {
	lns     []net.Listener
	started bool
	srvs    []*http.Server
	errc    chan error
	addrs   []string // the addresses bound
}

// listenSide listens on every address of addrs (empty ones skipped), which
// the setting called flag gives (--ops-addr); with none it listens on
// nothing. The caller calls start, or close.
func listenSide(ctx context.Context, flag string, addrs []string) (*sideServers, error) {
	s := &sideServers{}
	for _, a := range addrs {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		ln, err := listenTCP(ctx, flag, a)
		if err != nil {
			s.close()
			return nil, err
		}
		s.lns = append(s.lns, ln)
		s.addrs = append(s.addrs, ln.Addr().String())
	}
	return s, nil
}

// start serves h on every listener, over TLS when tc is not nil. The
// caller calls shutdown.
func (s *sideServers) start(h http.Handler, tc *tls.Config, log *slog.Logger) {
	s.started = true
	s.errc = make(chan error, len(s.lns))
	for _, ln := range s.lns {
		srv := &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		s.srvs = append(s.srvs, srv)
		go func() {
			err := serveHTTP(srv, ln, tc)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			if err != nil {
				log.Error("ops listener failed", "addr", ln.Addr().String(), "err", err)
			}
			s.errc <- err
		}()
	}
}

// shutdown stops the servers start started, waiting for their requests
// until ctx ends, and returns the first error they failed with.
func (s *sideServers) shutdown(ctx context.Context) error {
	for _, srv := range s.srvs {
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
	}
	var err error
	for range s.srvs {
		err = errors.Join(err, <-s.errc)
	}
	s.srvs = nil
	return err
}

// close closes the listeners of servers never started.
func (s *sideServers) close() {
	if s == nil || s.started {
		return
	}
	for _, ln := range s.lns {
		ln.Close()
	}
}

// listenGRPC opens the gRPC listeners c asks for: Addr's (first) and
// Unix's, at least one.
func listenGRPC(ctx context.Context, c GRPCConfig) ([]net.Listener, error) {
	if c.Addr == NoAddr && c.Unix == "" {
		return nil, configError("--grpc-addr and --grpc-unix are both empty: gRPC needs one of them")
	}
	var lns []net.Listener
	if c.Addr != NoAddr {
		ln, err := listenTCP(ctx, "--grpc-addr", c.Addr)
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
	}
	if c.Unix != "" {
		ln, err := listenUnix(ctx, c.Unix, c.UnixMode)
		if err != nil {
			closeAll(lns)
			return nil, fmt.Errorf("gRPC: %w", err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// closeAll closes every listener of lns.
func closeAll(lns []net.Listener) {
	for _, l := range lns {
		l.Close()
	}
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
