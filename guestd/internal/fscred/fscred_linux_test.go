//go:build linux

package fscred

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestDo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (setfsuid)")
	}
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's parent is private to root.
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	nobody := Cred{UID: 65534, GID: 65534}
	err := Do(nobody, func() error {
		if _, err := os.ReadFile(secret); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("read of a root 0600 file as nobody: %v, want permission denied", err)
		}
		return os.WriteFile(filepath.Join(dir, "mine"), nil, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "mine"))
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Sys().(*syscall.Stat_t); s.Uid != 65534 || s.Gid != 65534 {
		t.Fatalf("file created as nobody is owned by %d:%d", s.Uid, s.Gid)
	}
	// Nothing leaks to other threads: many calls, then root access again.
	for range 50 {
		_ = Do(nobody, func() error { return nil })
	}
	for range 50 {
		if _, err := os.ReadFile(secret); err != nil {
			t.Fatalf("root lost access after Do: %v", err)
		}
	}
	if err := Do(Root, func() error { _, err := os.ReadFile(secret); return err }); err != nil {
		t.Fatalf("Do(Root): %v", err)
	}
}
