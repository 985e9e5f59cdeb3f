package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/peterbourgon/ff/v4"
)

// storeTLSFlags are the TLS settings of a rediss:// store.
type storeTLSFlags struct {
	ca, cert, key string
	skipHostname  bool
}

func (f *storeTLSFlags) register(fs *ff.FlagSet) {
	fs.StringVar(&f.ca, 0, "store-ca", "", withEnv("store-ca", "PEM CA bundle that signs the rediss:// store's certificate (default: the system's)"))
	fs.StringVar(&f.cert, 0, "store-cert", "", withEnv("store-cert", "PEM client certificate for the rediss:// store"))
	fs.StringVar(&f.key, 0, "store-key", "", withEnv("store-key", "PEM private key of --store-cert"))
	fs.BoolVarDefault(&f.skipHostname, 0, "store-skip-hostname-verification", false, withEnv("store-skip-hostname-verification",
		"accept a store certificate that the CAs signed whatever name it carries"))
}

// config returns the tls.Config of the store spec names, or nil for the
// defaults (the system's roots and the URL's host name). Settings for a
// store that is not rediss:// are refused.
func (f storeTLSFlags) config(spec string) (*tls.Config, error) {
	if f.ca == "" && f.cert == "" && f.key == "" && !f.skipHostname {
		return nil, nil
	}
	if !strings.HasPrefix(strings.ToLower(spec), "rediss") {
		return nil, usageError("--store-ca, --store-cert, --store-key and --store-skip-hostname-verification need a rediss:// store")
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, usageError("--store-ca: %v", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usageError("--store-ca %s: no PEM certificate in it", f.ca)
		}
	}
	if (f.cert == "") != (f.key == "") {
		return nil, usageError("--store-cert and --store-key go together")
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, usageError("--store-cert: %v", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	if f.skipHostname {
		// Verify the chain against the roots, but not the name.
		roots := c.RootCAs
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
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
	return c, nil
}
