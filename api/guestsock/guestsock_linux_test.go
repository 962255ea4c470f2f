//go:build linux

package guestsock

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/exectest"
)

// self addresses a path in this process's own root, which is what a
// sandbox's init looks like to the dialer (a root and a path below it).
func self(t *testing.T, path string) Addr {
	t.Helper()
	a, err := Self(path)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// listen serves a unix socket at path and reports every accepted connection.
func listen(t *testing.T, path string) <-chan struct{} {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			got <- struct{}{}
		}
	}()
	return got
}

func dial(t *testing.T, a Addr) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, a)
	if err == nil {
		c.Close()
	}
	return err
}

func noConnection(t *testing.T, got <-chan struct{}) {
	t.Helper()
	select {
	case <-got:
		t.Fatal("the planted target received a connection")
	case <-time.After(50 * time.Millisecond):
	}
}

func TestDialReachesTheSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "aci.sock")
	got := listen(t, sock)
	if err := dial(t, self(t, sock)); err != nil {
		t.Fatalf("Dial: %v", err)
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
	}
}

func TestDialRefusesPlantedSymlinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "host.sock")
	got := listen(t, target)

	// The socket itself replaced by a symlink (absolute, as a sandbox's root
	// would plant it), and a directory on the path replaced by one.
	link := filepath.Join(dir, "aci.sock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, filepath.Join(dir, "run")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, filepath.Join(dir, "run", "host.sock")} {
		err := dial(t, self(t, p))
		if !errors.Is(err, ErrUnsafePath) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Dial(%s) = %v, want ErrUnsafePath", p, err)
		}
	}
	noConnection(t, got)
}

func TestDialRefusesNonSockets(t *testing.T) {
	p := filepath.Join(t.TempDir(), "aci.sock")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dial(t, self(t, p)); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("Dial(regular file) = %v, want ErrUnsafePath", err)
	}
}

func TestDialMissingSocketIsUnavailable(t *testing.T) {
	err := dial(t, self(t, filepath.Join(t.TempDir(), "nothing", "aci.sock")))
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Dial(missing) = %v, want ErrUnavailable (retryable)", err)
	}
}

func TestDialRefusesAnotherProcess(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "aci.sock")
	got := listen(t, sock)

	// The recorded start time is not this pid's: a reused pid.
	a := self(t, sock)
	a.Start++
	if err := dial(t, a); !errors.Is(err, ErrProcessGone) || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Dial(other start time) = %v, want ErrProcessGone", err)
	}

	// A process that exited.
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	pid := uint32(cmd.Process.Pid)
	start, err := ProcessStart(pid)
	cmd.Wait()
	if err == nil {
		if err := dial(t, Addr{PID: pid, Start: start, Path: sock}); !errors.Is(err, ErrProcessGone) {
			t.Fatalf("Dial(exited pid) = %v, want ErrProcessGone", err)
		}
	}
	noConnection(t, got)
}

func TestAddrString(t *testing.T) {
	a := Addr{PID: 42, Start: 7, Path: "/run/forkfleet/aci.sock"}
	if s := a.String(); s != "/proc/42/root/run/forkfleet/aci.sock" {
		t.Fatalf("String = %q", s)
	}
	b, err := Parse(a.String(), a.Start)
	if err != nil || b != a {
		t.Fatalf("Parse(String) = %+v, %v; want %+v", b, err, a)
	}
	for _, bad := range []string{"", "/run/forkfleet/aci.sock", "/proc/x/root/a", "/proc/0/root/a", "/proc/1/root/", "/proc/1/root/a/../b", "/proc/1/cwd/a"} {
		if _, err := Parse(bad, 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if _, err := Parse(a.String(), 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Parse without a start time = %v, want ErrInvalidArgument", err)
	}
	if !(Addr{}).IsZero() || (Addr{}).String() != "" {
		t.Error("zero Addr")
	}
}

func TestParseStart(t *testing.T) {
	line := []byte("1234 (a b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615")
	if v, err := parseStart(line); err != nil || v != 987654 {
		t.Fatalf("parseStart = %d, %v", v, err)
	}
	if _, err := parseStart([]byte("1 (x) S 1")); err == nil {
		t.Fatal("short stat accepted")
	}
}

// BenchmarkDial is the cost of a checked dial (pinned process, openat2,
// fstat, connect through /proc/self/fd) ...
func BenchmarkDial(b *testing.B) {
	benchDial(b, func(ctx context.Context, a Addr) (net.Conn, error) { return Dial(ctx, a) })
}

// ... and BenchmarkDialPath the plain connect(2) to /proc/<pid>/root/...
// it replaced.
func BenchmarkDialPath(b *testing.B) {
	var d net.Dialer
	benchDial(b, func(ctx context.Context, a Addr) (net.Conn, error) { return d.DialContext(ctx, "unix", a.String()) })
}

func benchDial(b *testing.B, dial func(context.Context, Addr) (net.Conn, error)) {
	sock := filepath.Join(b.TempDir(), "aci.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	a, err := Self(sock)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		c, err := dial(ctx, a)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

func TestMain(m *testing.M) {
	exectest.Main()
	os.Exit(m.Run())
}

// TestDialThroughExecFromAThread: a sandbox's init that execs from a thread
// other than its leader (guestd does, to become tini's child) is not gone;
// a dial in that moment is retryable (it failed disk-tier forks at N=16,
// about one replica in a hundred, with ErrProcessGone).
func TestDialThroughExecFromAThread(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "aci.sock")
	listen(t, sock)
	cmd := exectest.Command(300)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := uint32(cmd.Process.Pid)
	start, err := ProcessStart(pid)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		bufio.NewReader(out).ReadString('\n') // "done", or EOF if the helper died
		close(done)
	}()
	a := Addr{PID: pid, Start: start, Path: sock}
	var dials, unavailable int
	for {
		select {
		case <-done:
			if s, err := ProcessStart(pid); err != nil || s != start {
				t.Fatalf("the exec helper died: %v", err)
			}
			t.Logf("%d dials, %d unavailable", dials, unavailable)
			return
		default:
		}
		dials++
		err := dial(t, a)
		switch {
		case err == nil:
		case errors.Is(err, errdefs.ErrUnavailable):
			unavailable++
		default:
			t.Fatalf("dial %d, while the process execs from a thread: %v", dials, err)
		}
	}
}
