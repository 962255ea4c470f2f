package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// A remote controld gets the token over TLS or, explicitly, in plaintext;
// never in plaintext by default. Nothing here connects anywhere: the
// refusal comes before the first call.
func TestRemoteNeedsTLS(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("secret\n"), 0o600)
	ctx := context.Background()
	err := run(ctx, []string{"--address", "192.0.2.1:7443", "--token-file", tok, "list"}, io.Discard)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "plaintext") {
		t.Fatalf("remote without TLS: %v", err)
	}
	if err := run(ctx, []string{"--address", "192.0.2.1:7443", "--token-file", tok, "--tls-ca", filepath.Join(dir, "none.pem"), "list"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--tls-ca") {
		t.Fatalf("missing CA file: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "empty.pem"), nil, 0o600)
	if err := run(ctx, []string{"--address", "192.0.2.1:7443", "--token-file", tok, "--tls-ca", filepath.Join(dir, "empty.pem"), "list"}, io.Discard); err == nil || !strings.Contains(err.Error(), "no PEM") {
		t.Fatalf("empty CA file: %v", err)
	}
}
