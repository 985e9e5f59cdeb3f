// Package tlsreload serves TLS with a certificate, and optionally a client
// CA bundle for mutual TLS, read from PEM files, and reads them again when
// they change, without a restart.
//
// The files are checked on each TLS handshake, by stat (following
// symlinks), not watched: a Kubernetes Secret volume replaces its files by
// swapping a symlink, which a watch on the files misses, and cert-manager,
// certbot and editors rename new files into place; a stat of three files
// costs microseconds against the milliseconds of a handshake, and needs no
// goroutine. A change of modification time, size or inode makes the next
// handshake load all the files again; files that do not load (a
// certificate without its new key, half written) leave the last good ones
// in force and are reported once per change.
package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
)

// Files names the PEM files of a TLS server.
type Files struct {
	// Cert is the server's certificate chain, leaf first. Required.
	Cert string
	// Key is the certificate's private key. Required.
	Key string
	// ClientCA, when set, is a bundle of CA certificates: every client must
	// then present a certificate that one of them signed (mutual TLS).
	ClientCA string
	// ClientSAN, when set (with ClientCA), is a name every client
	// certificate must carry among its subject alternative names: DNS
	// name, URI, IP address or email address.
	ClientSAN string
}

// Loader holds the files' certificates and reloads them when the files
// change. It is safe for concurrent use.
type Loader struct {
	files   Files
	onError func(error)

	mu     sync.Mutex
	stamps []os.FileInfo // of Cert, Key, ClientCA in order; nil when unreadable
	cur    *material
}

// material is what one load of the files gives.
type material struct {
	cert *tls.Certificate
	pool *x509.CertPool // nil without ClientCA
}

// New loads the files and returns their Loader. onError, if not nil, is
// told of each reload that fails (the files in force stay); it is called
// during a handshake, so it must not block.
func New(f Files, onError func(error)) (*Loader, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: a certificate and its key are both required")
	}
	if f.ClientSAN != "" && f.ClientCA == "" {
		return nil, errors.New("tls: a client SAN needs a client CA to verify certificates against")
	}
	l := &Loader{files: f, onError: onError}
	l.stamps = l.stat()
	m, err := l.load()
	if err != nil {
		return nil, err
	}
	l.cur = m
	return l, nil
}

// paths returns the files to watch, in stamp order.
func (l *Loader) paths() []string {
	p := []string{l.files.Cert, l.files.Key}
	if l.files.ClientCA != "" {
		p = append(p, l.files.ClientCA)
	}
	return p
}

// stat returns the files' FileInfos, nil for one that cannot be read.
func (l *Loader) stat() []os.FileInfo {
	paths := l.paths()
	out := make([]os.FileInfo, len(paths))
	for i, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			out[i] = fi
		}
	}
	return out
}

// same reports whether two stats describe the same unchanged file.
func same(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}

// load reads the files.
func (l *Loader) load() (*material, error) {
	cert, err := tls.LoadX509KeyPair(l.files.Cert, l.files.Key)
	if err != nil {
		return nil, fmt.Errorf("tls: load %s and %s: %w", l.files.Cert, l.files.Key, err)
	}
	m := &material{cert: &cert}
	if l.files.ClientCA != "" {
		pem, err := os.ReadFile(l.files.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("tls: client CA: %w", err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: client CA %s: no PEM certificate in it", l.files.ClientCA)
		}
	}
	return m, nil
}

// current returns the material in force, reloading it first if a file
// changed since the last look.
func (l *Loader) current() *material {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stat()
	if slices.EqualFunc(st, l.stamps, same) {
		return l.cur
	}
	l.stamps = st
	m, err := l.load()
	if err != nil {
		if l.onError != nil {
			l.onError(fmt.Errorf("%w; the certificates in force stay", err))
		}
		return l.cur
	}
	l.cur = m
	return m
}

// Reload reads the files again now, whether or not they look changed
// (SIGHUP asks it of a server: a file replaced with the same size and
// time is not seen otherwise), and returns why the certificates in force
// stay, if they do. It is safe to call concurrently with handshakes.
func (l *Loader) Reload() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stamps = l.stat()
	m, err := l.load()
	if err != nil {
		return fmt.Errorf("%w; the certificates in force stay", err)
	}
	l.cur = m
	return nil
}

// Certificate returns the server certificate in force, after a reload if a
// file changed.
func (l *Loader) Certificate() *tls.Certificate { return l.current().cert }

// Config returns a server tls.Config that offers nextProtos in ALPN
// ("h2" for gRPC; "h2", "http/1.1" for HTTP) and takes each handshake's
// certificates from l, reloaded when the files change.
func (l *Loader) Config(nextProtos ...string) *tls.Config {
	protos := slices.Clone(nextProtos)
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: protos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := l.current()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   protos,
				Certificates: []tls.Certificate{*m.cert},
			}
			if m.pool != nil {
				c.ClientAuth = tls.RequireAndVerifyClientCert
				c.ClientCAs = m.pool
				if san := l.files.ClientSAN; san != "" {
					c.VerifyConnection = func(cs tls.ConnectionState) error { return checkSAN(cs, san) }
				}
			}
			return c, nil
		},
	}
}

// checkSAN fails unless the client's verified leaf certificate names san.
func checkSAN(cs tls.ConnectionState, san string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	if slices.Contains(leaf.DNSNames, san) || slices.Contains(leaf.EmailAddresses, san) {
		return nil
	}
	for _, u := range leaf.URIs {
		if u.String() == san {
			return nil
		}
	}
	if ip := net.ParseIP(san); ip != nil {
		for _, a := range leaf.IPAddresses {
			if a.Equal(ip) {
				return nil
			}
		}
	}
	return fmt.Errorf("tls: client certificate does not name %q", san)
}
