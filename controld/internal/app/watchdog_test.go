package app_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/health"
)

// Under systemd (Type=notify, WatchdogSec=): READY=1 once serving, then
// WATCHDOG=1 while controld's own health check passes and none while it
// fails, STOPPING=1 at shutdown.
func TestSystemdReadyWatchdogStopping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "100000") // 100 ms: a ping every 50 ms

	hc := health.New()
	var sick atomic.Bool
	hc.AddCheck("test", func(context.Context) error {
		if sick.Load() {
			return errors.New("made sick by the test")
		}
		return nil
	})
	cfg := testConfig(t)
	rt := fleettest.NewRuntime()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, cfg, app.Deps{Runtime: rt, Dialer: fleettest.Dialer{R: rt}, Health: hc,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	defer func() {
		cancel()
		<-done
	}()

	// next returns the next notification, or "" when none came within d.
	next := func(d time.Duration) string {
		buf := make([]byte, 256)
		ln.SetReadDeadline(time.Now().Add(d))
		n, err := ln.Read(buf)
		if err != nil {
			return ""
		}
		return string(buf[:n])
	}
	if m := next(10 * time.Second); !strings.HasPrefix(m, "READY=1") {
		t.Fatalf("first notification %q, want READY=1", m)
	}
	if hc.State() != health.Serving {
		t.Fatalf("state %v after READY", hc.State())
	}
	for range 3 {
		if m := next(2 * time.Second); m != "WATCHDOG=1" {
			t.Fatalf("healthy: %q, want WATCHDOG=1", m)
		}
	}
	sick.Store(true)
	next(200 * time.Millisecond) // one ping may have been in flight
	if m := next(400 * time.Millisecond); m != "" {
		t.Fatalf("failing check: got %q, want no ping", m)
	}
	sick.Store(false)
	if m := next(2 * time.Second); m != "WATCHDOG=1" {
		t.Fatalf("recovered: %q", m)
	}
	cancel()
	for {
		m := next(10 * time.Second)
		if m == "" {
			t.Fatal("no STOPPING=1")
		}
		if strings.HasPrefix(m, "STOPPING=1") {
			break
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	done <- nil
	if hc.State() != health.Stopping {
		t.Fatalf("state %v after stop", hc.State())
	}
}
