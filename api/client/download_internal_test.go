package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// TestDownload: download writes the whole body to the file, or nothing
// (a refused ticket, a body cut short of its Content-Length).
func TestDownload(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("ticket") {
		case "ok":
			w.Header().Set("Content-Length", "5")
			w.Write([]byte("hello"))
		case "short":
			w.Header().Set("Content-Length", "10")
			w.Write([]byte("hello"))
		default:
			http.Error(w, "missing, invalid, expired or spent recording ticket", http.StatusUnauthorized)
		}
	}))
	defer ts.Close()
	dir := t.TempDir()
	ctx := context.Background()
	dst := filepath.Join(dir, "out.mp4")
	if n, err := download(ctx, nil, ts.URL+"/f?ticket=ok", dst); err != nil || n != 5 {
		t.Fatalf("download: %d %v", n, err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "hello" {
		t.Fatalf("downloaded %q", b)
	}
	if _, err := download(ctx, nil, ts.URL+"/f?ticket=spent", filepath.Join(dir, "a")); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("a refused ticket: %v", err)
	}
	if _, err := download(ctx, nil, ts.URL+"/f?ticket=short", filepath.Join(dir, "b")); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a short body: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}
