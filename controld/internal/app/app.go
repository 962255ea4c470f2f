// Package app wires controld together: store, runtime, manager, gRPC API,
// ACI gateway, metrics and traces, with an ordered shutdown.
package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/health"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Version is controld's version, set at link time.
var Version = "dev"

// Deps are what Run does not build from the configuration: the runtime
// (containerdrt in production, a fake or containerdrt in tests) and,
// optionally, the guest dialer.
type Deps struct {
	Runtime runtime.Runtime   // required
	Dialer  fleet.GuestDialer // nil: guestconn over the ACI client
	Logger  *slog.Logger      // nil: slog.Default()
	// OnReady, when set, is called once every listener serves.
	OnReady func(Addrs)
	// Health, when set, is the checker controld reports into (tests add
	// loops and checks of their own); nil: a fresh one.
	Health *health.Checker
}

// Addrs are the bound addresses (useful with port 0 in tests).
type Addrs struct {
	GRPCUnix string
	GRPCTCP  string
	Gateway  string
	Metrics  string
	Token    string // the TCP API token
}

// Run serves until ctx ends, then shuts down in order. Sandboxes keep
// running; the next Run adopts them. gRPC (health and reflection) and the
// metrics port answer from before startup reconciliation; the controld
// services, the gateway, grpc.health.v1 SERVING, /readyz and READY=1 follow
// it. The start-up steps are in start.go, the shutdown steps in
// shutdown.go.
func Run(ctx context.Context, cfg *config.Config, deps Deps) error {
	if deps.Runtime == nil {
		return errors.New("controld: no runtime")
	}
	d := newControld(cfg, deps)
	if err := d.start(ctx); err != nil {
		return err
	}
	if deps.OnReady != nil {
		deps.OnReady(d.addrs)
	}
	runErr := d.wait(ctx)
	return errors.Join(append([]error{runErr}, d.shutdown()...)...)
}

// listenUnix listens on a unix socket, replacing a stale socket file.
// Access is by file permissions: root and the socket's group.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("controld: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("controld: %s exists and is not a socket", path)
		}
		// A live controld would hold the store lock, so this one is stale.
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("controld: listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("controld: chmod %s: %w", path, err)
	}
	return ln, nil
}

// loadToken returns the TCP API token: the configured token file when
// present, else the generated one under the state dir (created on first
// start, mode 0600).
func loadToken(cfg *config.Config) (string, error) {
	if f := cfg.GRPC.TokenFile; f != "" {
		b, err := os.ReadFile(f)
		switch {
		case err == nil:
			t := strings.TrimSpace(string(b))
			if t == "" {
				return "", fmt.Errorf("controld: token file %s is empty", f)
			}
			return t, nil
		case !errors.Is(err, os.ErrNotExist):
			return "", fmt.Errorf("controld: token file: %w", err)
		}
	}
	p := cfg.TokenPath()
	if b, err := os.ReadFile(p); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("controld: token: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	t := hex.EncodeToString(raw[:])
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("controld: write token: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", fmt.Errorf("controld: write token: %w", err)
	}
	return t, nil
}
