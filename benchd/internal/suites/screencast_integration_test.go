//go:build linux

package suites

import (
	"context"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/runner"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
	"go.opentelemetry.io/otel/trace/noop"
)

// integrationEnv is a suiteapi.Env that builds guestd from this monorepo.
func integrationEnv(t *testing.T) *suiteapi.Env {
	t.Helper()
	integration(t)
	for _, bin := range []string{"Xvfb", "openbox", "xterm", "xsetroot", "go"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not installed: the integration test cannot run", bin)
		}
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "guestd", "go.mod")); err != nil {
		t.Fatalf("monorepo root not found at %s: %v", root, err)
	}
	return &suiteapi.Env{RepoRoot: root, WorkDir: t.TempDir(), Tracer: noop.NewTracerProvider().Tracer("test"), Log: io.Discard, Warmup: -1}
}

func rowsByKey(t *testing.T, rows []result.Row) map[string]result.Row {
	t.Helper()
	m := map[string]result.Row{}
	for _, r := range rows {
		if err := r.Validate(); err != nil {
			t.Errorf("row %s: %v", r.Key(), err)
		}
		k := r.Key()
		if r.Baseline {
			k += " [baseline]"
		}
		if _, dup := m[k]; dup {
			t.Errorf("duplicate row %s", k)
		}
		m[k] = r
	}
	return m
}

func wantRow(t *testing.T, rows map[string]result.Row, key string, check func(result.Row) bool) {
	t.Helper()
	r, ok := rows[key]
	if !ok {
		t.Errorf("missing row %s", key)
		return
	}
	if r.N == 0 || !check(r) {
		t.Errorf("row %s: n=%d samples=%v", key, r.N, r.Samples)
	}
}

// TestScreencastSuiteSmoke runs a cut-down screencast suite (delta-zlib and
// delta-png at 30 fps, x11vnc included) against a real Xvfb, guestd and
// x11vnc, and checks the rows that carry its claims.
func TestScreencastSuiteSmoke(t *testing.T) {
	env := integrationEnv(t)
	s := &screencastSuite{}
	fs := flag.NewFlagSet("screencast", flag.ContinueOnError)
	s.Flags(fs)
	if err := fs.Parse([]string{"--screencast-window", "2s", "--screencast-idle", "1s", "--screencast-fps", "30",
		"--screencast-latency-fps", "30", "--screencast-modes", "delta-zlib,delta-png", "--screencast-scrolls", "2"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if _, err := runner.ResolvePeers(s, env); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx, env); err != nil {
		t.Fatal(err)
	}
	rows, err := s.Run(ctx, env)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	m := rowsByKey(t, rows)
	zero := func(r result.Row) bool { return *r.Max == 0 }
	positive := func(r result.Row) bool { return *r.Min > 0 }
	for _, content := range []string{"sparse", "dense"} {
		for _, mode := range []string{"delta-zlib", "delta-png"} {
			pre := " content=" + content + " fps=30 mode=" + mode + " system=forkfleet"
			wantRow(t, m, "screencast.reconstruction_mismatch_pixels"+pre, zero)
			wantRow(t, m, "screencast.idle_bytes_3s"+pre, zero)
			wantRow(t, m, "screencast.idle_frames_3s"+pre, func(r result.Row) bool { return *r.P50 == 1 })
			wantRow(t, m, "screencast.update_wire_bytes"+pre, positive)
			wantRow(t, m, "screencast.key_to_update"+pre, positive)
		}
		wantRow(t, m, "screencast.key_to_update content="+content+" mode=rfb-zrle requests=outstanding system=x11vnc tuning=defaults [baseline]", positive)
	}
	wantRow(t, m, "screencast.scroll_wire_bytes content=scroll fps=30 mode=delta-zlib system=forkfleet", positive)
	wantRow(t, m, "screencast.scroll_vs_full content=scroll mode=rfb-zrle requests=outstanding system=x11vnc tuning=defaults [baseline]", positive)
}

// TestGuestCPUSuiteSmoke runs the guestcpu suite with one short window per
// cell against the real stack.
func TestGuestCPUSuiteSmoke(t *testing.T) {
	env := integrationEnv(t)
	g := &guestCPUSuite{}
	fs := flag.NewFlagSet("guestcpu", flag.ContinueOnError)
	g.Flags(fs)
	if err := fs.Parse([]string{"--guestcpu-window", "1s", "--guestcpu-reps", "1", "--guestcpu-fps", "30"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := runner.ResolvePeers(g, env); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, env); err != nil {
		t.Fatal(err)
	}
	rows, err := g.Run(ctx, env)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	m := rowsByKey(t, rows)
	nonneg := func(r result.Row) bool { return *r.Min >= 0 }
	wantRow(t, m, "guestcpu.cpu capture=none fps=0 proc=total system=forkfleet workload=no-stream-idle", nonneg)
	wantRow(t, m, "guestcpu.cpu capture=xdamage fps=30 proc=total system=forkfleet workload=stream-typing", nonneg)
	wantRow(t, m, "guestcpu.frames capture=xdamage fps=30 system=forkfleet workload=stream-idle", func(r result.Row) bool { return *r.Max == 0 })
	wantRow(t, m, "guestcpu.frames capture=xdamage fps=30 system=forkfleet workload=stream-typing", func(r result.Row) bool { return *r.Min > 0 })
	wantRow(t, m, "guestcpu.cpu capture=poll fps=x11vnc-paced proc=total-with-injector system=x11vnc tuning=defaults workload=stream-typing [baseline]", nonneg)
}
