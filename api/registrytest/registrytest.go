// Package registrytest runs a real OCI registry (Debian's docker-registry,
// which `make test-tools` unpacks into Bin) on a free loopback port, its
// storage in a directory of its own: the registry checkpoints are pushed to
// and pulled from by controld's real-stack tests and benchd's remote suite.
// Loopback only (the machines' network rule): controld reaches it over
// plain HTTP, which it allows for loopback registries alone.
package registrytest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Bin is where deploy/host-setup.sh --registry unpacks docker-registry.
const Bin = "/var/cache/forkfleet/registry/bin/docker-registry"

// startTimeout bounds the wait for the registry to answer /v2/.
const startTimeout = 30 * time.Second

// Registry is a running docker-registry.
type Registry struct {
	// Addr is its host:port on 127.0.0.1.
	Addr string
	// Log is the file its output goes to.
	Log string

	cmd      *exec.Cmd
	logf     *os.File
	exitedCh chan struct{}
}

// Start runs the registry binary bin (Bin when empty) with its storage and
// log under dir, and waits until it answers.
func Start(ctx context.Context, bin, dir string) (*Registry, error) {
	if bin == "" {
		bin = Bin
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("docker-registry not installed (make test-tools): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	conf := filepath.Join(dir, "config.yml")
	yml := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n",
		filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(conf, []byte(yml), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("docker-registry: %w", err)
	}
	r := &Registry{Addr: addr, Log: logf.Name(), cmd: cmd, logf: logf}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: time.Second}
	deadline := time.Now().Add(startTimeout)
	for {
		resp, err := hc.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				r.exitedCh = exited
				return r, nil
			}
		}
		select {
		case <-exited:
			logf.Close()
			return nil, fmt.Errorf("docker-registry exited before answering (log %s)", r.Log)
		case <-ctx.Done():
			r.kill(exited)
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.kill(exited)
			return nil, errors.New("docker-registry on " + addr + " never answered /v2/ (log " + r.Log + ")")
		}
	}
}

func (r *Registry) kill(exited chan struct{}) {
	r.cmd.Process.Kill()
	<-exited
	r.logf.Close()
}

// Close stops the registry; closing again does nothing.
func (r *Registry) Close() { r.kill(r.exitedCh) }
