//go:build linux

package supervise

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/guestd/internal/config"
	"github.com/forkfleet/forkfleet/guestd/internal/reaper"
)

func newSup(t *testing.T, grace time.Duration) (*Supervisor, *reaper.Reaper) {
	t.Helper()
	rp, err := reaper.New(reaper.All)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rp.Close)
	return New(rp, slog.New(slog.DiscardHandler), []string{"PATH=/usr/bin:/bin"}, grace), rp
}

func eventually(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRestartOnCrash(t *testing.T) {
	s, _ := newSup(t, time.Second)
	f := filepath.Join(t.TempDir(), "runs")
	var exits atomic.Int32
	s.Start(Spec{Name: "crashy", Path: "/bin/sh", Args: []string{"-c", "echo run >> " + f + "; exit 3"},
		Restart: config.RestartOnFailure, OnExit: func(st reaper.Status) {
			if st.ExitCode() == 3 {
				exits.Add(1)
			}
		}})
	eventually(t, 5*time.Second, "three restarts", func() bool { return s.Restarts("crashy") >= 3 })
	b, _ := os.ReadFile(f)
	if n := strings.Count(string(b), "run"); n < 3 || exits.Load() < 3 {
		t.Fatalf("runs %d exits %d", n, exits.Load())
	}
	s.Stop()
}

func TestCleanExitNotRestarted(t *testing.T) {
	s, _ := newSup(t, time.Second)
	done := make(chan struct{})
	s.Start(Spec{Name: "once", Path: "/bin/true", Restart: config.RestartOnFailure, OnExit: func(reaper.Status) { close(done) }})
	<-done
	time.Sleep(200 * time.Millisecond)
	if s.Restarts("once") != 0 {
		t.Fatal("restarted after a clean exit")
	}
	s.Stop()
}

func TestStopEscalatesToKill(t *testing.T) {
	s, _ := newSup(t, 200*time.Millisecond)
	ready := filepath.Join(t.TempDir(), "ready")
	s.Start(Spec{Name: "stubborn", Path: "/bin/sh", Args: []string{"-c", `trap "" TERM; touch ` + ready + `; while :; do sleep 0.05; done`}, Restart: config.RestartAlways})
	eventually(t, 2*time.Second, "trap installed", func() bool { _, err := os.Stat(ready); return err == nil })
	pid := s.Pid("stubborn")
	t0 := time.Now()
	s.Stop("stubborn")
	if d := time.Since(t0); d < 200*time.Millisecond || d > 3*time.Second {
		t.Fatalf("stop took %v", d)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !os.IsNotExist(err) {
		t.Fatal("process still exists (or is an unreaped zombie)")
	}
	// A polite program stops at SIGTERM, well within the grace.
	s2 := New(s.reaper, slog.New(slog.DiscardHandler), nil, 5*time.Second)
	s2.Start(Spec{Name: "polite", Path: "/bin/sleep", Args: []string{"30"}, Restart: config.RestartAlways})
	eventually(t, 2*time.Second, "start", func() bool { return s2.Pid("polite") != 0 })
	t0 = time.Now()
	s2.Stop()
	if time.Since(t0) > time.Second {
		t.Fatalf("SIGTERM stop took %v", time.Since(t0))
	}
}

func TestNotifyFD(t *testing.T) {
	s, _ := newSup(t, time.Second)
	got := make(chan string, 1)
	s.Start(Spec{Name: "notifier", Path: "/bin/sh", Args: []string{"-c", "echo 42 >&3; exec sleep 30"},
		Restart: config.RestartAlways, NotifyFD: true, OnNotify: func(l string) { got <- l }})
	select {
	case l := <-got:
		if l != "42" {
			t.Fatalf("notify %q", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no notification")
	}
	s.Stop()
}

// zombies lists our children in state Z.
func zombies() []string {
	self := strconv.Itoa(os.Getpid())
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[0] == "Z" && f[1] == self {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestOrphansReaped(t *testing.T) {
	// sh exits at once; its background sleeps are reparented to us (child
	// subreaper) and must be reaped when they exit, without a waiter.
	sup, rp := newSup(t, time.Second)
	done := make(chan struct{})
	sp := Spec{Name: "parent", Path: "/bin/sh", Args: []string{"-c", "sleep 0.2 & sleep 0.2 & exit 0"}, Restart: config.RestartNever,
		OnExit: func(reaper.Status) { close(done) }}
	sup.Start(sp)
	<-done
	eventually(t, 5*time.Second, "orphans reaped", func() bool { return rp.Orphans() >= 2 })
	if z := zombies(); len(z) != 0 {
		t.Fatalf("zombies: %v", z)
	}
	sup.Stop()
}

func TestToPixel(t *testing.T) {
	if p := toPixel(0x2f3b4c, 0xff0000, 0xff00, 0xff); p != 0x2f3b4c {
		t.Fatalf("24-bit: %#x", p)
	}
	if p := toPixel(0xffffff, 0xf800, 0x7e0, 0x1f); p != 0xffff {
		t.Fatalf("16-bit white: %#x", p)
	}
}
