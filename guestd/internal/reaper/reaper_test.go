//go:build linux

package reaper

import (
	"os/exec"
	"testing"
	"time"
)

func TestOwnModeStatus(t *testing.T) {
	r, err := New(Own)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, tc := range []struct {
		args []string
		code int
	}{{[]string{"-c", "exit 0"}, 0}, {[]string{"-c", "exit 42"}, 42}, {[]string{"-c", "kill -KILL $$"}, -1}} {
		ch, err := r.Start(exec.Command("/bin/sh", tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case st := <-ch:
			if st.ExitCode() != tc.code {
				t.Fatalf("%v: %v", tc.args, st)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no status")
		}
	}
	// Own mode leaves other children alone: a plain exec.Cmd still gets
	// its own status through Wait.
	cmd := exec.Command("/bin/sh", "-c", "exit 5")
	if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 5 {
		t.Fatalf("foreign child: %v", err)
	}
}

func TestSingleAllReaper(t *testing.T) {
	r, err := New(All)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(All); err == nil {
		t.Fatal("second All-mode reaper allowed")
	}
	r.Close()
	r2, err := New(All)
	if err != nil {
		t.Fatal(err)
	}
	r2.Close()
	if _, err := r2.Start(exec.Command("/bin/true")); err != ErrClosed {
		t.Fatalf("start after close: %v", err)
	}
}
