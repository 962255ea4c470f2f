//go:build linux

package guestd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRunRefusesWithoutToken(t *testing.T) {
	var out, errb bytes.Buffer
	err := Run(context.Background(), []string{"--config", filepath.Join(t.TempDir(), "missing.json")}, &out, &errb, func(string) string { return "" })
	if err == nil {
		t.Fatal("started with an explicit missing config")
	}
	// The default path falls back to the embedded config, then needs a token.
	err = Run(context.Background(), []string{"--no-supervise", "--listen-tcp", "127.0.0.1:0"}, &out, &errb, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "FORKFLEET_ACI_TOKEN") {
		t.Fatalf("want a refusal naming the token, got %v", err)
	}
}

func TestRunVersion(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"--version"}, &out, &out, func(string) string { return "" }); err != nil || !strings.HasPrefix(out.String(), "guestd ") {
		t.Fatalf("%q %v", out.String(), err)
	}
}

func TestRunServesExistingDisplayUntilCanceled(t *testing.T) {
	// --no-supervise against a display that does not exist: guestd serves
	// (desktop requests UNAVAILABLE) and shuts down cleanly on cancel.
	ctx, cancel := context.WithCancel(context.Background())
	addr := filepath.Join(t.TempDir(), "addr")
	done := make(chan error, 1)
	var logb bytes.Buffer
	go func() {
		done <- Run(ctx, []string{"--no-supervise", "--display", ":199", "--listen-tcp", "127.0.0.1:0", "--addr-file", addr, "--insecure-no-auth"},
			&logb, &logb, func(string) string { return "" })
	}()
	waitFile(t, addr)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func waitFile(t *testing.T, p string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", p)
}
