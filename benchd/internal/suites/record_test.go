//go:build linux

package suites

import (
	"context"
	"flag"
	"io"
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// TestRecordSuiteSmoke runs the record suite with 5 s episodes against the
// host's controld: each mode is measured, the recording's trajectory has a
// line per step (the suite fails otherwise) and ffprobe reads the MP4 with
// the export's frames and duration.
func TestRecordSuiteSmoke(t *testing.T) {
	integration(t)
	sock := os.Getenv("FORKFLEET_CONTROLD_SOCKET")
	if sock == "" {
		sock = "/run/forkfleet/controld.sock"
	}
	env := &suiteapi.Env{ControldSocket: sock, WorkDir: t.TempDir(), Tracer: noop.NewTracerProvider().Tracer("test"), Log: io.Discard, Warmup: -1}
	r := &recordSuite{}
	fs := flag.NewFlagSet("record", flag.ContinueOnError)
	r.Flags(fs)
	if err := fs.Parse([]string{"--record-episode", "5s"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := r.Check(ctx, env); err != nil {
		t.Fatalf("check (make demo starts controld, deploy/host-setup.sh installs ffmpeg): %v", err)
	}
	rows, err := r.Run(ctx, env)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	rowsByKey(t, rows) // valid and distinct
	seen := map[string]bool{}
	for _, row := range rows {
		if row.P50 == nil {
			t.Errorf("row %s without a value", row.Key())
			continue
		}
		seen[row.Metric+" "+row.Labels["mode"]] = true
		if row.Metric == "record.disk_bytes_per_s" && *row.P50 <= 0 {
			t.Errorf("recorded nothing: %s", row.Key())
		}
	}
	for _, k := range []string{"record.sandbox_cpu bare", "record.sandbox_cpu screencast", "record.sandbox_cpu recorded",
		"record.disk_bytes_per_s recorded", "record.mp4_frames recorded", "record.mp4_duration_s recorded"} {
		if !seen[k] {
			t.Errorf("no %s row", k)
		}
	}
}
