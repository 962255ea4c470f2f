package config

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci/acitest"
)

// TestPlaintextRemoteRefused is issue #12 item 11: without TLS, a gRPC TCP
// listener or a gateway off the loopback would carry bearer tokens in the
// clear; such a configuration is refused unless explicitly allowed.
func TestPlaintextRemoteRefused(t *testing.T) {
	env := func(string) string { return "" }
	for _, args := range [][]string{
		{"--grpc-tcp", "0.0.0.0:7443"},
		{"--grpc-tcp", ":7443"},
		{"--gateway-listen", "10.0.0.5:7480"},
		{"--gateway-listen", "[::]:7480"},
		{"--gateway-listen", "sandbox-host:7480"},
	} {
		if _, _, err := LoadArgs(args, env); err == nil || !strings.Contains(err.Error(), "in the clear") {
			t.Errorf("%v: %v", args, err)
		}
		if _, _, err := LoadArgs(append(args, "--allow-plaintext-remote=true"), env); err != nil {
			t.Errorf("%v allowed: %v", args, err)
		}
	}
	for _, args := range [][]string{
		{"--grpc-tcp", "127.0.0.1:7443"}, {"--grpc-tcp", "[::1]:7443"}, {"--gateway-listen", "localhost:7480"}, {"--grpc-tcp", ""},
	} {
		if _, _, err := LoadArgs(args, env); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	certs := acitest.NewCerts(t)
	dir := certs.WriteFiles(t, t.TempDir())
	c, _, err := LoadArgs([]string{"--grpc-tcp", "0.0.0.0:7443", "--gateway-listen", "0.0.0.0:7480",
		"--tls-cert", dir + "/server.pem", "--tls-key", dir + "/server-key.pem", "--tls-client-ca", dir + "/ca.pem"}, env)
	if err != nil {
		t.Fatalf("remote binds with TLS: %v", err)
	}
	if cfg, err := c.TLS.ServerConfig(); err != nil || cfg == nil || cfg.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("server config: %v %v", cfg, err)
	}
	for _, args := range [][]string{
		{"--tls-cert", dir + "/server.pem"},
		{"--tls-client-ca", dir + "/ca.pem"},
	} {
		if _, _, err := LoadArgs(args, env); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	bad := Default().TLS
	bad.CertFile, bad.KeyFile = dir+"/server.pem", dir+"/client-key.pem" // not its key
	if _, err := bad.ServerConfig(); err == nil {
		t.Error("mismatched key pair loaded")
	}
	if d := Default(); d.TLS.Enabled() || d.TLS.AllowPlaintextRemote || d.Gateway.MaxHandshakes <= 0 ||
		d.Gateway.HeaderTimeout.D() != 5*time.Second || d.Gateway.IdleTimeout.D() != 5*time.Second {
		t.Fatalf("defaults %+v %+v", d.TLS, d.Gateway)
	}
}

// TestCertificateReload: a renewed certificate is served without a
// restart; a half-written one does not replace the working pair.
func TestCertificateReload(t *testing.T) {
	first, second := acitest.NewCerts(t), acitest.NewCerts(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writes := 0
	write := func(c, k []byte) {
		os.WriteFile(cert, c, 0o600)
		os.WriteFile(key, k, 0o600)
		// A new modification time each write, whatever the file system's
		// clock granularity.
		writes++
		later := time.Now().Add(time.Duration(writes) * time.Minute)
		os.Chtimes(cert, later, later)
		os.Chtimes(key, later, later)
	}
	write(first.ServerCertPEM, first.ServerKeyPEM)
	cfg, err := TLS{CertFile: cert, KeyFile: key}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	served := func() []byte {
		t.Helper()
		c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Certificate[0]
	}
	if string(served()) != string(first.Server.Certificate[0]) {
		t.Fatal("not the first certificate")
	}
	time.Sleep(certRecheck)
	write(second.ServerCertPEM, first.ServerKeyPEM) // half-way: key not yet renewed
	if string(served()) != string(first.Server.Certificate[0]) {
		t.Fatal("a mismatched pair replaced the working one")
	}
	time.Sleep(certRecheck)
	write(second.ServerCertPEM, second.ServerKeyPEM)
	if string(served()) != string(second.Server.Certificate[0]) {
		t.Fatal("the renewed certificate is not served")
	}
}
