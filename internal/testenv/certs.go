package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority made for a test, valid for an hour.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte // Cert in PEM
	key  *ecdsa.PrivateKey
}

var serials atomic.Int64

// NewCA returns a new CA called name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serials.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}
}

// Pool returns a pool holding only c.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.Cert)
	return p
}

// Issued is a certificate a CA signed, and its key, in PEM.
type Issued struct {
	CertPEM, KeyPEM []byte
	Serial          *big.Int
}

// Pair returns the certificate as a tls.Certificate.
func (i Issued) Pair(t testing.TB) *tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(i.CertPEM, i.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// Write writes the certificate and key to certPath and keyPath, each as a
// new file renamed over the old one, as cert-manager and editors do.
func (i Issued) Write(t testing.TB, certPath, keyPath string) {
	t.Helper()
	for path, data := range map[string][]byte{certPath: i.CertPEM, keyPath: i.KeyPEM} {
		ReplaceFile(t, path, data)
	}
}

// ReplaceFile writes data to a new file and renames it over path.
func ReplaceFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Issue returns a certificate that c signs for a client (client true) or a
// server, for 127.0.0.1 and the names given: DNS names, or URIs when they
// have a scheme (spiffe://...). The first name is the subject's.
func (c *CA) Issue(t testing.TB, client bool, names ...string) Issued {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serials.Add(1)),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	for _, n := range names {
		if u, err := url.Parse(n); err == nil && u.Scheme != "" {
			tmpl.URIs = append(tmpl.URIs, u)
			continue
		}
		tmpl.DNSNames = append(tmpl.DNSNames, n)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Issued{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		Serial:  tmpl.SerialNumber,
	}
}
