package acitest

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
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs is a throwaway PKI for TLS tests, generated in the test: a CA, a
// server certificate for localhost, 127.0.0.1 and ::1, and a client
// certificate, all signed by the CA.
type Certs struct {
	CAPEM                       []byte
	ServerCertPEM, ServerKeyPEM []byte
	ClientCertPEM, ClientKeyPEM []byte

	Roots  *x509.CertPool
	Server tls.Certificate
	Client tls.Certificate
}

// NewCerts generates a fresh CA and its server and client certificates
// (ECDSA P-256, valid for an hour).
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	ca, caKey := newCert(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "forkfleet test CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	c := &Certs{CAPEM: pemOf("CERTIFICATE", ca.Raw), Roots: x509.NewCertPool()}
	c.Roots.AddCert(ca)
	srv, srvKey := newCert(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey)
	cli, cliKey := newCert(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "trainer"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, caKey)
	c.ServerCertPEM, c.ServerKeyPEM = pemOf("CERTIFICATE", srv.Raw), keyPEM(t, srvKey)
	c.ClientCertPEM, c.ClientKeyPEM = pemOf("CERTIFICATE", cli.Raw), keyPEM(t, cliKey)
	var err error
	if c.Server, err = tls.X509KeyPair(c.ServerCertPEM, c.ServerKeyPEM); err != nil {
		t.Fatal(err)
	}
	if c.Client, err = tls.X509KeyPair(c.ClientCertPEM, c.ClientKeyPEM); err != nil {
		t.Fatal(err)
	}
	return c
}

// ServerConfig serves the server certificate; with clientCAs it requires a
// client certificate signed by the CA.
func (c *Certs) ServerConfig(clientCAs bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{c.Server}, MinVersion: tls.VersionTLS12}
	if clientCAs {
		cfg.ClientCAs, cfg.ClientAuth = c.Roots, tls.RequireAndVerifyClientCert
	}
	return cfg
}

// ClientConfig trusts the CA; withCert presents the client certificate.
func (c *Certs) ClientConfig(withCert bool) *tls.Config {
	cfg := &tls.Config{RootCAs: c.Roots, MinVersion: tls.VersionTLS12}
	if withCert {
		cfg.Certificates = []tls.Certificate{c.Client}
	}
	return cfg
}

// WriteFiles writes ca.pem, server.pem, server-key.pem, client.pem and
// client-key.pem into dir and returns dir.
func (c *Certs) WriteFiles(t testing.TB, dir string) string {
	t.Helper()
	for name, b := range map[string][]byte{
		"ca.pem": c.CAPEM, "server.pem": c.ServerCertPEM, "server-key.pem": c.ServerKeyPEM,
		"client.pem": c.ClientCertPEM, "client-key.pem": c.ClientKeyPEM,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func newCert(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Minute)
	tmpl.NotAfter = time.Now().Add(time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func keyPEM(t testing.TB, k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pemOf("PRIVATE KEY", der)
}

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
