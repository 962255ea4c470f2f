// Command kube-apiserver is Kubernetes' own API server (k8s.io/kubernetes/cmd/kube-apiserver, the same code
// as the release binary) with an embedded etcd, both on loopback, for the server-side dry run of
// deploy/kubernetes's manifests (manifests_test.go). No Debian package has a kube-apiserver and envtest
// downloads prebuilt binaries; this one is built from Go modules only (build.sh, cached by its inputs).
//
//	kube-apiserver -dir DIR
//	kube-apiserver -version
//
// DIR holds etcd's data, the generated CA, serving certificate, service account key and bearer token, and,
// once the server answers /readyz, DIR/kubeconfig (written last, by rename: a client that sees it can use it).
// The user of the kubeconfig's token is in system:masters. SIGTERM or SIGINT stops both servers.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	etcdversion "go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // as cmd/kube-apiserver: the JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // as cmd/kube-apiserver: client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // as cmd/kube-apiserver: the version metric
	"k8s.io/component-base/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	dir := flag.String("dir", "", "state directory (etcd data, certificates, token, kubeconfig)")
	printVersion := flag.Bool("version", false, "print the Kubernetes and etcd versions and exit")
	flag.Parse()
	if *printVersion {
		fmt.Printf("kube-apiserver %s, etcd %s\n", version.Get().GitVersion, etcdversion.Version)
		return
	}
	if *dir == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: kube-apiserver -dir DIR")
		os.Exit(2)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		fatal(err)
	}
	etcdURL, etcd, err := startEtcd(*dir)
	if err != nil {
		fatal(fmt.Errorf("etcd: %w", err))
	}
	c, err := newCredentials(*dir)
	if err != nil {
		fatal(err)
	}
	port, err := freePort()
	if err != nil {
		fatal(err)
	}
	server := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	go func() {
		if err := c.writeKubeconfigWhenReady(filepath.Join(*dir, "kubeconfig"), server); err != nil {
			fatal(err)
		}
	}()

	cmd := app.NewAPIServerCommand()
	cmd.SetArgs([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(*dir, "certs"),
		"--tls-cert-file=" + c.certFile,
		"--tls-private-key-file=" + c.keyFile,
		"--token-auth-file=" + c.tokenFile,
		"--authorization-mode=RBAC",
		// As kubeadm and every cluster that runs node agents: without it the
		// API server refuses any privileged container, whatever the namespace's
		// Pod Security level.
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.saKeyFile,
		"--service-account-signing-key-file=" + c.saKeyFile,
		// Allocated from, never routed: nothing here leaves the loopback.
		"--service-cluster-ip-range=10.0.0.0/24",
		// No nodes and no kube-proxy: the kubernetes Service would otherwise get
		// an endpoint on 127.0.0.1, which the endpoints validation refuses.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	})
	code := cli.Run(cmd)
	etcd.Close()
	os.Exit(code)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "kube-apiserver:", err)
	os.Exit(1)
}

// freePort is a loopback port free now. kube-apiserver's flags take a port,
// not a listener; another process taking it in between fails the start
// loudly (address in use), never serves elsewhere.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts a one-member etcd on loopback ports and returns its client
// URL once it serves. Its data is a test's: no fsync.
func startEtcd(dir string) (string, *embed.Etcd, error) {
	var urls [2]url.URL
	for i := range urls {
		port, err := freePort()
		if err != nil {
			return "", nil, err
		}
		urls[i] = url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	}
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = urls[:1], urls[:1]
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = urls[1:], urls[1:]
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return urls[0].String(), e, nil
	case err := <-e.Err():
		e.Close()
		return "", nil, err
	case <-time.After(time.Minute):
		e.Close()
		return "", nil, fmt.Errorf("not ready after a minute")
	}
}

// credentials are the files the server is started with: a CA and the
// serving certificate it signed (for 127.0.0.1), the service account
// signing key, and a bearer token of a system:masters user.
type credentials struct {
	caPEM                                   []byte
	token                                   string
	certFile, keyFile, saKeyFile, tokenFile string
}

func newCredentials(dir string) (*credentials, error) {
	c := &credentials{
		certFile:  filepath.Join(dir, "serving.crt"),
		keyFile:   filepath.Join(dir, "serving.key"),
		saKeyFile: filepath.Join(dir, "service-account.key"),
		tokenFile: filepath.Join(dir, "tokens.csv"),
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "forkfleet dry-run CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	c.token = hex.EncodeToString(tok)
	c.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	for _, f := range []struct {
		path string
		data []byte
	}{
		{c.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
		{c.keyFile, ecPEM(key)},
		{c.saKeyFile, ecPEM(saKey)},
		{c.tokenFile, []byte(c.token + ",forkfleet-admin,forkfleet-admin,system:masters\n")},
	} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func ecPEM(k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		panic(err) // a P-256 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// writeKubeconfigWhenReady waits for the server's /readyz (every post-start
// hook done: the built-in RBAC roles, the priority levels, the default
// namespaces) and then writes the kubeconfig by rename.
func (c *credentials) writeKubeconfigWhenReady(path, server string) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s/readyz: not ready after 3 minutes", server)
		case <-time.After(200 * time.Millisecond):
		}
	}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: dry-run
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: forkfleet-admin
  user:
    token: %s
contexts:
- name: dry-run
  context: {cluster: dry-run, user: forkfleet-admin}
current-context: dry-run
`, server, base64.StdEncoding.EncodeToString(c.caPEM), c.token)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(kubeconfig), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
