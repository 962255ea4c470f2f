//go:build linux

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
	"github.com/forkfleet/forkfleet/benchd/internal/schemacheck"
)

// TestActionSmokeE2E runs the action suite with a tiny n against a real
// Xvfb + openbox + guestd (built from the monorepo) and validates the file.
func TestActionSmokeE2E(t *testing.T) {
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("set FORKFLEET_INTEGRATION=1 to run against a real Xvfb and guestd")
	}
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"run", "--suite", "action", "--out", root, "--n", "3", "--warmup", "1"}, &out, &errb)
	if code != exitOK {
		t.Fatalf("benchd run --suite action: exit %d\n%s", code, errb.String())
	}
	files, _ := filepath.Glob(filepath.Join(root, "*", "action-*.json"))
	if len(files) != 1 {
		t.Fatalf("want one result file, got %v", files)
	}
	doc, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile("../../results/schema.json")
	if err != nil {
		t.Fatal(err)
	}
	violations, err := schemacheck.Validate(schema, doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(violations) > 0 {
		t.Fatalf("schema violations:\n%s", strings.Join(violations, "\n"))
	}
	r, err := result.Decode(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != result.StatusOK {
		t.Fatalf("status %s: %s", r.Status, r.Reason)
	}
	got := map[string]result.Row{}
	for _, row := range r.Rows {
		got[row.Key()] = row
	}
	for _, key := range []string{"action.ping", "action.move", "action.click", "action.key", "action.type_1_char",
		"action.screenshot content=sparse format=png", "action.screenshot content=dense format=jpeg-q80",
		"action.screenshot content=photo format=png", "action.screenshot_unchanged content=dense format=png",
		"action.click_png_step content=sparse", "peer.true"} {
		row, ok := got[key]
		if !ok {
			t.Errorf("row %q missing", key)
			continue
		}
		if row.N != 3 || row.Warmup != 1 || row.Failed != 0 || row.Unverified != 0 {
			t.Errorf("%s: n=%d warmup=%d failed=%d unverified=%d", key, row.N, row.Warmup, row.Failed, row.Unverified)
		}
	}
	if !got["peer.true"].Baseline {
		t.Error("peer row not marked baseline")
	}
	if r.Host.Cores < 1 || r.Host.Kernel == "" || r.Build.ExecutableSHA256 == "" {
		t.Errorf("fingerprint incomplete: %+v %+v", r.Host, r.Build)
	}
}
