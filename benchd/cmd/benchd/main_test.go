package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

func writeResult(t *testing.T, dir string, at time.Time, rows ...result.Row) string {
	t.Helper()
	r := &result.Result{Schema: result.SchemaID, Suite: "action", Status: result.StatusOK, StartedAt: at, FinishedAt: at.Add(time.Second),
		Host: result.Host{Cores: 1, HostEnv: map[string]string{}}, Config: map[string]any{}, Rows: rows}
	loc, err := result.Reserve(dir, r.Suite, at)
	if err != nil {
		t.Fatal(err)
	}
	p, err := result.Write(loc, r)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCompareExitCodes(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	old := writeResult(t, dir, t0, result.Single("action.ping", "ms", nil, 1), result.Single("clientscale.frames_per_s", "frames/s", nil, 1000))
	same := writeResult(t, dir, t0.Add(time.Minute), result.Single("action.ping", "ms", nil, 1.1), result.Single("clientscale.frames_per_s", "frames/s", nil, 950))
	slower := writeResult(t, dir, t0.Add(2*time.Minute), result.Single("action.ping", "ms", nil, 2), result.Single("clientscale.frames_per_s", "frames/s", nil, 1000))
	lessThroughput := writeResult(t, dir, t0.Add(3*time.Minute), result.Single("action.ping", "ms", nil, 1), result.Single("clientscale.frames_per_s", "frames/s", nil, 500))
	cases := []struct {
		args []string
		code int
	}{
		{[]string{"compare", old, same}, exitOK},
		{[]string{"compare", old, slower}, exitFailed},
		{[]string{"compare", old, lessThroughput}, exitFailed},
		{[]string{"compare", old, slower, "--threshold", "150"}, exitOK},
		{[]string{"compare", "--threshold", "150", old, slower}, exitOK},
		{[]string{"compare", old}, exitUsage},
		{[]string{"compare", old, filepath.Join(dir, "nope.json")}, exitInfraError},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		if got := run(context.Background(), c.args, &out, &errb); got != c.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", c.args[1:], got, c.code, out.String(), errb.String())
		}
	}
	var out bytes.Buffer
	run(context.Background(), []string{"compare", old, slower}, &out, &out)
	if !strings.Contains(out.String(), "REGRESSED") {
		t.Fatalf("table lacks the verdict:\n%s", out.String())
	}
}

func TestListAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if run(context.Background(), []string{"list"}, &out, &errb) != exitOK {
		t.Fatal("list failed")
	}
	for _, s := range []string{"action", "codec", "step", "dedup", "clientscale", "boot", "fanout", "checkpoint", "fork", "pool", "screencast", "guestcpu"} {
		if !strings.Contains(out.String(), s+" ") {
			t.Errorf("list lacks %s", s)
		}
	}
	if run(context.Background(), []string{"run"}, &out, &errb) != exitUsage {
		t.Error("run without --suite accepted")
	}
	if run(context.Background(), []string{"run", "--suite", "nope"}, &out, &errb) != exitUsage {
		t.Error("unknown suite accepted")
	}
	if run(context.Background(), []string{"bogus"}, &out, &errb) != exitUsage {
		t.Error("unknown command accepted")
	}
}

func TestRunSkippedSuiteExitsZero(t *testing.T) {
	root := t.TempDir()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"run", "--suite", "boot", "--out", root, "--controld-socket", filepath.Join(root, "absent.sock")}, &out, &errb)
	if code != exitOK {
		t.Fatalf("skipped suite exit %d: %s", code, errb.String())
	}
	files, _ := filepath.Glob(filepath.Join(root, "*", "boot-*.json"))
	if len(files) != 1 {
		t.Fatalf("result files: %v", files)
	}
	r, err := result.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != result.StatusSkipped || !strings.Contains(r.Reason, "absent") {
		t.Fatalf("%s: %s", r.Status, r.Reason)
	}
}

func TestReport(t *testing.T) {
	dir := t.TempDir()
	writeResult(t, dir, time.Now().UTC(), result.Single("action.ping", "ms", nil, 1))
	out := filepath.Join(t.TempDir(), "docs", "benchmarks.md")
	var so, se bytes.Buffer
	if code := run(context.Background(), []string{"report", "--results", dir, "--out", out}, &so, &se); code != exitOK {
		t.Fatalf("report exit %d: %s", code, se.String())
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
}
