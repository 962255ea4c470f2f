package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// certRecheck is how often a handshake may look at the certificate files
// for a renewal (a stat of each).
const certRecheck = time.Second

// ServerConfig loads the certificate, key and client CAs into a server
// tls.Config for the gRPC TCP listener and the gateway (the caller sets
// NextProtos for its protocol). It returns nil when TLS is off. The key
// pair is read again on a handshake after the files changed, so a renewed
// certificate takes effect without a restart; a renewal that does not load
// keeps the previous pair (and fails no handshake).
func (t TLS) ServerConfig() (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	kp := &keyPair{certFile: t.CertFile, keyFile: t.KeyFile}
	if err := kp.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: kp.get,
	}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.client_ca_file %s: no PEM certificate in it", t.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// keyPair is a certificate and key loaded from files, reloaded when either
// file's size or modification time changes.
type keyPair struct {
	certFile, keyFile string

	mu        sync.Mutex
	cert      *tls.Certificate
	stamp     [2]fileStamp
	checkedAt time.Time
}

type fileStamp struct {
	size int64
	mod  time.Time
}

func stampOf(path string) (fileStamp, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{size: st.Size(), mod: st.ModTime()}, nil
}

func (k *keyPair) stamps() ([2]fileStamp, error) {
	c, err1 := stampOf(k.certFile)
	key, err2 := stampOf(k.keyFile)
	return [2]fileStamp{c, key}, errors.Join(err1, err2)
}

// load reads both files; the caller holds mu or owns k.
func (k *keyPair) load() error {
	st, err := k.stamps()
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("tls.cert_file %s, tls.key_file %s: %w", k.certFile, k.keyFile, err)
	}
	k.cert, k.stamp, k.checkedAt = &cert, st, time.Now()
	return nil
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Since(k.checkedAt) >= certRecheck {
		k.checkedAt = time.Now()
		if st, err := k.stamps(); err == nil && st != k.stamp {
			// A half-written renewal fails to load; the old pair serves
			// until the next look finds both files complete.
			_ = k.load()
		}
	}
	return k.cert, nil
}
