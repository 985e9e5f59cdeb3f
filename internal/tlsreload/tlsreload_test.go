package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
)

// server accepts TLS connections on loopback with cfg and completes each
// handshake, then writes one byte; it stops when the test ends.
func server(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				// One byte says the handshake passed; a refused one closes.
				if c.(*tls.Conn).Handshake() != nil {
					return
				}
				_, _ = c.Write([]byte("k"))
				_, _ = c.Read(make([]byte, 1)) // until the client closes
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// dial connects with roots trusted and the client certificate, if any,
// and returns the serial number of the server's certificate.
func dial(addr string, roots *x509.CertPool, client *tls.Certificate) (*big.Int, error) {
	cfg := &tls.Config{RootCAs: roots, ServerName: "sluice.test", NextProtos: []string{"h2"}}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// With TLS 1.3 the server checks the client's certificate after the
	// client's handshake is done: the server's byte says it passed.
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return nil, err
	}
	if _, err := c.Read(make([]byte, 1)); err != nil {
		return nil, fmt.Errorf("refused: %w", err)
	}
	if got := c.ConnectionState().NegotiatedProtocol; got != "h2" {
		return nil, errors.New("ALPN negotiated " + got + ", want h2")
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReload serves a certificate, replaces its files, and checks that
// the next handshake presents the new one; a broken replacement keeps the
// one in force and is reported.
func TestReload(t *testing.T) {
	t.Parallel()
	authority := testenv.NewCA(t, "test CA")
	roots := authority.Pool()
	dir := t.TempDir()
	a, b := authority.Issue(t, false, "sluice.test"), authority.Issue(t, false, "sluice.test")
	certA, keyA, serialA := a.CertPEM, a.KeyPEM, a.Serial
	keyB, certB, serialB := b.KeyPEM, b.CertPEM, b.Serial
	writeFiles(t, dir, map[string][]byte{"tls.crt": certA, "tls.key": keyA})

	errs := make(chan error, 10)
	l, err := New(Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}, func(err error) { errs <- err })
	if err != nil {
		t.Fatal(err)
	}
	addr := server(t, l.Config("h2"))
	if got, err := dial(addr, roots, nil); err != nil || got.Cmp(serialA) != 0 {
		t.Fatalf("first handshake: serial %v, %v; want %v", got, err, serialA)
	}

	// The key first, then the certificate: in between the pair does not
	// match, and the old pair stays.
	testenv.ReplaceFile(t, filepath.Join(dir, "tls.key"), keyB)
	if got, err := dial(addr, roots, nil); err != nil || got.Cmp(serialA) != 0 {
		t.Fatalf("half replaced: serial %v, %v; want the old %v", got, err, serialA)
	}
	select {
	case err := <-errs:
		t.Logf("reported: %v", err)
	default:
		t.Fatal("a broken reload was not reported")
	}
	testenv.ReplaceFile(t, filepath.Join(dir, "tls.crt"), certB)
	if got, err := dial(addr, roots, nil); err != nil || got.Cmp(serialB) != 0 {
		t.Fatalf("after the reload: serial %v, %v; want the new %v", got, err, serialB)
	}
	if len(errs) != 0 {
		t.Errorf("a good reload reported %v", <-errs)
	}

	// A Kubernetes Secret volume: the files are symlinks through ..data,
	// which is swapped to a new directory.
	kdir := t.TempDir()
	c := authority.Issue(t, false, "sluice.test")
	certC, keyC, serialC := c.CertPEM, c.KeyPEM, c.Serial
	for i, pair := range [][2][]byte{{certA, keyA}, {certC, keyC}} {
		d := filepath.Join(kdir, "..v"+string(rune('1'+i)))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		writeFiles(t, d, map[string][]byte{"tls.crt": pair[0], "tls.key": pair[1]})
	}
	if err := os.Symlink("..v1", filepath.Join(kdir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(kdir, f)); err != nil {
			t.Fatal(err)
		}
	}
	kl, err := New(Files{Cert: filepath.Join(kdir, "tls.crt"), Key: filepath.Join(kdir, "tls.key")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kaddr := server(t, kl.Config("h2"))
	if got, err := dial(kaddr, roots, nil); err != nil || got.Cmp(serialA) != 0 {
		t.Fatalf("secret volume: serial %v, %v; want %v", got, err, serialA)
	}
	if err := os.Symlink("..v2", filepath.Join(kdir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(kdir, "..data_tmp"), filepath.Join(kdir, "..data")); err != nil {
		t.Fatal(err)
	}
	if got, err := dial(kaddr, roots, nil); err != nil || got.Cmp(serialC) != 0 {
		t.Fatalf("secret volume swapped: serial %v, %v; want %v", got, err, serialC)
	}
}

// TestMutualTLS checks client certificate verification: a certificate the
// client CA signed passes, one without the SAN asked for, one another CA
// signed and none at all are refused; the client CA reloads too.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	authority, other := testenv.NewCA(t, "test CA"), testenv.NewCA(t, "other CA")
	roots := authority.Pool()
	dir := t.TempDir()
	srv := authority.Issue(t, false, "sluice.test")
	writeFiles(t, dir, map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "ca.crt": authority.PEM})
	l, err := New(Files{
		Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"),
		ClientCA: filepath.Join(dir, "ca.crt"), ClientSAN: "spiffe://cluster/ns/edge/sa/envoy",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := server(t, l.Config("h2"))
	envoy := authority.Issue(t, true, "envoy", "spiffe://cluster/ns/edge/sa/envoy").Pair(t)
	stranger := authority.Issue(t, true, "stranger", "spiffe://cluster/ns/edge/sa/other").Pair(t)
	foreign := other.Issue(t, true, "envoy", "spiffe://cluster/ns/edge/sa/envoy").Pair(t)
	for _, tt := range []struct {
		name   string
		client *tls.Certificate
		ok     bool
	}{
		{"the client CA's, with the SAN", envoy, true},
		{"the client CA's, another SAN", stranger, false},
		{"another CA's", foreign, false},
		{"no certificate", nil, false},
	} {
		_, err := dial(addr, roots, tt.client)
		if (err == nil) != tt.ok {
			t.Errorf("%s: handshake error %v, want success %v", tt.name, err, tt.ok)
		}
	}
	// Trust the other CA instead: its client passes, the first CA's no more.
	testenv.ReplaceFile(t, filepath.Join(dir, "ca.crt"), other.PEM)
	if _, err := dial(addr, roots, foreign); err != nil {
		t.Errorf("after the client CA changed, its client: %v", err)
	}
	if _, err := dial(addr, roots, envoy); err == nil {
		t.Error("after the client CA changed, the old CA's client still passes")
	}
}

func TestNewRefusals(t *testing.T) {
	t.Parallel()
	authority := testenv.NewCA(t, "test CA")
	dir := t.TempDir()
	srv := authority.Issue(t, false, "sluice.test")
	writeFiles(t, dir, map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "empty.pem": []byte("no PEM here\n")})
	p := func(n string) string { return filepath.Join(dir, n) }
	for name, f := range map[string]Files{
		"no key":            {Cert: p("tls.crt")},
		"missing cert":      {Cert: p("nope.crt"), Key: p("tls.key")},
		"key for cert":      {Cert: p("tls.key"), Key: p("tls.crt")},
		"SAN without CA":    {Cert: p("tls.crt"), Key: p("tls.key"), ClientSAN: "x"},
		"CA without a cert": {Cert: p("tls.crt"), Key: p("tls.key"), ClientCA: p("empty.pem")},
		"missing CA":        {Cert: p("tls.crt"), Key: p("tls.key"), ClientCA: p("nope.pem")},
	} {
		if _, err := New(f, nil); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// TestReloadNow: Reload reads the files whatever their stamps say, and a
// broken pair is its error while the certificate in force stays.
func TestReloadNow(t *testing.T) {
	t.Parallel()
	authority := testenv.NewCA(t, "test CA")
	dir := t.TempDir()
	a, b := authority.Issue(t, false, "sluice.test"), authority.Issue(t, false, "sluice.test")
	writeFiles(t, dir, map[string][]byte{"tls.crt": a.CertPEM, "tls.key": a.KeyPEM})
	l, err := New(Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	serial := func() *big.Int {
		c, err := x509.ParseCertificate(l.cur.cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c.SerialNumber
	}
	writeFiles(t, dir, map[string][]byte{"tls.crt": b.CertPEM, "tls.key": b.KeyPEM})
	if err := l.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := serial(); got.Cmp(b.Serial) != 0 {
		t.Errorf("after Reload: serial %v, want %v", got, b.Serial)
	}
	writeFiles(t, dir, map[string][]byte{"tls.key": a.KeyPEM})
	if err := l.Reload(); err == nil {
		t.Error("Reload of a certificate with another's key: no error")
	}
	if got := serial(); got.Cmp(b.Serial) != 0 {
		t.Errorf("after a broken Reload: serial %v, want %v still", got, b.Serial)
	}
}
