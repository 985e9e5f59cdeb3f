package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// config returns the tls.Config of the store spec names, or nil for the
// defaults (the system's roots and the URL's host name). Settings for a
// store that is not rediss:// are refused.
func (c StoreTLSConfig) config(spec string) (*tls.Config, error) {
	if c.CA == "" && c.Cert == "" && c.Key == "" && !c.SkipHostnameVerification {
		return nil, nil
	}
	if !strings.HasPrefix(strings.ToLower(spec), "rediss") {
		return nil, configError("--store-ca, --store-cert, --store-key and --store-skip-hostname-verification need a rediss:// store")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pem, err := os.ReadFile(c.CA)
		if err != nil {
			return nil, configError("--store-ca: %v", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, configError("--store-ca %s: no PEM certificate in it", c.CA)
		}
	}
	if (c.Cert == "") != (c.Key == "") {
		return nil, configError("--store-cert and --store-key go together")
	}
	if c.Cert != "" {
		pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, configError("--store-cert: %v", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	if c.SkipHostnameVerification {
		// Verify the chain against the roots, but not the name.
		roots := tc.RootCAs
		tc.InsecureSkipVerify = true
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the store sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return fmt.Errorf("tls: store certificate: %w", err)
			}
			return nil
		}
	}
	return tc, nil
}
