package redisresp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// TLSOptions refine Options.TLS. CA, Cert and Key each hold PEM text or the
// path of a PEM file; files are read when a connection is dialled, never
// before, so that building a client does no I/O and a renewed certificate is
// picked up by the next connection.
type TLSOptions struct {
	CA                 string // certificates trusted for the server; empty: the system roots
	Cert               string // client certificate, sent when the server asks (tls-auth-clients)
	Key                string // the client certificate's private key
	ServerName         string // name checked in the server's certificate; empty: the dialled host
	InsecureSkipVerify bool   // accept any server certificate
}

// ErrTLSConfig: a CA, certificate or key could not be read or parsed.
var ErrTLSConfig = errors.New("bad redis TLS settings")

// IsPEM reports whether v is inline PEM text rather than a file path.
func IsPEM(v string) bool {
	return strings.Contains(v, "-----BEGIN ")
}

// Check parses the inline PEM values (files are left for the dial) and
// returns the name of the first bad one ("ca", "cert" or "key") with the
// reason, or "" and nil.
func (o TLSOptions) Check() (string, error) {
	if o.CA != "" && IsPEM(o.CA) {
		if _, err := o.roots(); err != nil {
			return "ca", err
		}
	}

	if (o.Cert == "") != (o.Key == "") {
		if o.Cert == "" {
			return "cert", errors.New("a client key needs its certificate")
		}

		return "key", errors.New("a client certificate needs its key")
	}

	if o.Cert != "" && IsPEM(o.Cert) && IsPEM(o.Key) {
		if _, err := o.pair(); err != nil {
			return "cert", err
		}
	}

	return "", nil
}

// Config builds the TLS configuration for a connection to host, reading the
// files it names.
func (o TLSOptions) Config(host string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.InsecureSkipVerify}
	if o.ServerName != "" {
		cfg.ServerName = o.ServerName
	}

	if o.CA != "" {
		roots, err := o.roots()
		if err != nil {
			return nil, err
		}

		cfg.RootCAs = roots
	}

	if o.Cert != "" || o.Key != "" {
		pair, err := o.pair()
		if err != nil {
			return nil, err
		}

		cfg.Certificates = []tls.Certificate{pair}
	}

	return cfg, nil
}

func (o TLSOptions) roots() (*x509.CertPool, error) {
	data, err := readPEM("CA", o.CA)
	if err != nil {
		return nil, err
	}

	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%w: CA %s holds no PEM certificate", ErrTLSConfig, source(o.CA))
	}

	return roots, nil
}

func (o TLSOptions) pair() (tls.Certificate, error) {
	cert, err := readPEM("client certificate", o.Cert)
	if err != nil {
		return tls.Certificate{}, err
	}

	key, err := readPEM("client key", o.Key)
	if err != nil {
		return tls.Certificate{}, err
	}

	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		// The parser's message names no key material.
		return tls.Certificate{}, fmt.Errorf("%w: client certificate %s with key %s: %s", ErrTLSConfig, source(o.Cert), source(o.Key), err.Error())
	}

	return pair, nil
}

func readPEM(what, v string) ([]byte, error) {
	if IsPEM(v) {
		return []byte(v), nil
	}

	data, err := os.ReadFile(v)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the %s: %s", ErrTLSConfig, what, err.Error())
	}

	return data, nil
}

// source names a value in messages without quoting PEM text (a key must never
// reach a log).
func source(v string) string {
	if IsPEM(v) {
		return "(inline PEM)"
	}

	return v
}
