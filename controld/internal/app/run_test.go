package app_test

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// stepLog keeps the "shutdown step" records a controld logs, in order.
type stepLog struct {
	slog.Handler
	mu    *sync.Mutex
	steps *[]string
}

func newStepLog() stepLog {
	return stepLog{Handler: slog.DiscardHandler, mu: &sync.Mutex{}, steps: new([]string)}
}

func (h stepLog) Enabled(context.Context, slog.Level) bool { return true }

func (h stepLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "shutdown step" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "step" {
			h.mu.Lock()
			*h.steps = append(*h.steps, a.Value.String())
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func (h stepLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h stepLog) WithGroup(string) slog.Handler      { return h }

func (h stepLog) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(*h.steps)
}

// TestRunShutdownOrder pins controld's ordered shutdown: gRPC stops
// accepting, then drains, recordings end while the gateway still feeds
// them, then the gateway, the manager's loops, metrics, traces and last
// the store; the unix socket is gone when Run returns.
func TestRunShutdownOrder(t *testing.T) {
	others := goleak.IgnoreCurrent() // other tests' clients
	t.Cleanup(func() { goleak.VerifyNone(t, others) })
	cfg := testConfig(t)
	rt := fleettest.NewRuntime()
	t.Cleanup(rt.Close)
	log := newStepLog()
	d := startWith(t, cfg, app.Deps{Runtime: rt, Dialer: fleettest.Dialer{R: rt}, Logger: slog.New(log)})
	d.stop()
	want := []string{
		"stop accepting gRPC",
		"drain in-flight gRPC calls",
		"stop recordings",
		"stop gateway",
		"stop pool replenishers and reapers",
		"stop metrics",
		"flush traces",
		"close store",
	}
	if got := log.got(); !slices.Equal(got, want) {
		t.Errorf("shutdown steps %q, want %q", got, want)
	}
	if _, err := os.Stat(cfg.GRPC.UnixSocket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("unix socket after shutdown: %v", err)
	}
}

// listRefused is a runtime whose List fails: the manager's start-up
// reconciliation, late in controld's start, fails with it.
type listRefused struct{ *fleettest.Runtime }

func (listRefused) List(context.Context) ([]runtime.Instance, error) {
	return nil, errors.New("list refused")
}

// TestRunFailedStartLeavesNothing pins what a start that fails leaves:
// nothing. Whether it fails early (a listener's address taken) or late
// (the manager's reconciliation, after gRPC and metrics serve), Run
// returns the step's error, its goroutines are gone, the store is closed
// (it opens again), the listeners are closed (the unix socket removed),
// and a controld with the same configuration starts.
func TestRunFailedStartLeavesNothing(t *testing.T) {
	others := goleak.IgnoreCurrent() // other tests' clients
	t.Cleanup(func() { goleak.VerifyNone(t, others) })
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	rt := fleettest.NewRuntime()
	t.Cleanup(rt.Close)
	cases := []struct {
		name    string
		metrics string // the metrics listen address
		rt      runtime.Runtime
		want    string
	}{
		{"metrics address taken", taken.Addr().String(), rt, "listen " + taken.Addr().String()},
		{"reconciliation failed", "127.0.0.1:0", listRefused{rt}, "list refused"},
	}
	for _, c := range cases {
		cfg := testConfig(t)
		cfg.Metrics.Listen = c.metrics
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := app.Run(ctx, cfg, app.Deps{Runtime: c.rt, Dialer: fleettest.Dialer{R: rt}, Logger: slog.New(slog.DiscardHandler),
			OnReady: func(app.Addrs) { t.Errorf("%s: controld started", c.name) }})
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: Run: %v, want an error with %q", c.name, err, c.want)
		}
		if _, err := os.Stat(cfg.GRPC.UnixSocket); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: unix socket left: %v", c.name, err)
		}
		st, err := store.Open(filepath.Join(cfg.StateDir, "controld.db"))
		if err != nil {
			t.Fatalf("%s: the store after a failed start: %v", c.name, err)
		}
		st.Close()
		// The same configuration starts now.
		cfg.Metrics.Listen = "127.0.0.1:0"
		d := startWith(t, cfg, app.Deps{Runtime: rt, Dialer: fleettest.Dialer{R: rt}})
		d.stop()
	}
}
