//go:build linux

package sysops

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// tokenPipe returns the read end of a pipe that holds b, its writer closed
// (what ExecInit hands tini's child).
func tokenPipe(t *testing.T, b string) int {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(p[1], []byte(b)); err != nil {
		t.Fatal(err)
	}
	unix.Close(p[1])
	return p[0]
}

func TestReadTokens(t *testing.T) {
	got, err := ReadTokens(tokenPipe(t, "aci-1\nadmin-2\n"), "A", "B")
	if err != nil || got["A"] != "aci-1" || got["B"] != "admin-2" {
		t.Fatalf("ReadTokens: %v %v", got, err)
	}
	// An empty token stays empty (guestd then refuses to start, or warns
	// for the admin token, as with the environment).
	if got, err := ReadTokens(tokenPipe(t, "aci\n\n"), "A", "B"); err != nil || got["B"] != "" {
		t.Fatalf("empty admin token: %v %v", got, err)
	}
	for _, bad := range []string{"", "one\n", "a\nb", "a\nb\nc\n", "a\nb\n\n"} {
		if got, err := ReadTokens(tokenPipe(t, bad), "A", "B"); err == nil {
			t.Errorf("ReadTokens(%q) = %v, want an error", bad, got)
		}
	}
	// Bounded: a pipe that never ends is not read to the end.
	if _, err := ReadTokens(tokenPipe(t, strings.Repeat("x", 60000)+"\n\n"), "A", "B"); err == nil {
		t.Error("a 60 kB token was accepted")
	}
}

func TestUnderInitOnlyBelowPID1(t *testing.T) {
	if os.Getppid() == 1 {
		t.Skip("the test's parent is PID 1")
	}
	if err := SetUnderInit(); err == nil {
		t.Fatal("SetUnderInit accepted a parent that is not the init")
	}
	if SandboxInit() || GuestdOrInit(1) {
		t.Fatal("a refused --under-init counts as the sandbox's top")
	}
	if !GuestdOrInit(os.Getpid()) {
		t.Fatal("GuestdOrInit(self) = false")
	}
}
