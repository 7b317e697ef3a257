package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority made for one test, with a server certificate
// for 127.0.0.1 / "localhost" and a client certificate it signed, all PEM
// files in Dir.
type CA struct {
	Dir                   string
	CAFile, CAPEM         string
	ServerCert, ServerKey string // files
	ClientCert, ClientKey string // files
	ClientCertPEM         string
	ClientKeyPEM          string
}

// NewCA writes a fresh CA, server and client certificates under dir.
func NewCA(dir, name string) (*CA, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}

	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}

	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}

	caCert, _ := x509.ParseCertificate(caDER)
	c := &CA{Dir: dir, CAPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))}
	c.CAFile = filepath.Join(dir, name+"-ca.crt")

	if err := os.WriteFile(c.CAFile, []byte(c.CAPEM), 0o600); err != nil {
		return nil, err
	}

	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, file string) (string, string, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}

		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}

		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}

		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return "", "", err
		}

		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})

		if err := os.WriteFile(file+".crt", certPEM, 0o600); err != nil {
			return "", "", err
		}

		if err := os.WriteFile(file+".key", keyPEM, 0o600); err != nil {
			return "", "", err
		}

		return string(certPEM), string(keyPEM), nil
	}

	base := filepath.Join(dir, name)
	if _, _, err := issue(2, "redis", x509.ExtKeyUsageServerAuth, base+"-server"); err != nil {
		return nil, fmt.Errorf("issuing the server certificate: %w", err)
	}

	c.ServerCert, c.ServerKey = base+"-server.crt", base+"-server.key"

	if c.ClientCertPEM, c.ClientKeyPEM, err = issue(3, "tierlimit", x509.ExtKeyUsageClientAuth, base+"-client"); err != nil {
		return nil, fmt.Errorf("issuing the client certificate: %w", err)
	}

	c.ClientCert, c.ClientKey = base+"-client.crt", base+"-client.key"

	return c, nil
}
