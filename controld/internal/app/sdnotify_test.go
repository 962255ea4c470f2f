package app

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/health"
)

func TestSdNotify(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Fatalf("without NOTIFY_SOCKET: %v", err)
	}
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	if err := sdNotify("READY=1"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("got %q %v", buf[:n], err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	for _, tc := range []struct {
		env  func(string) string
		want time.Duration
		err  bool
	}{
		{env(), 0, false},
		{env("WATCHDOG_USEC", "30000000"), 30 * time.Second, false},
		{env("WATCHDOG_USEC", "30000000", "WATCHDOG_PID", strconv.Itoa(os.Getpid())), 30 * time.Second, false},
		{env("WATCHDOG_USEC", "30000000", "WATCHDOG_PID", "1"), 0, false}, // for another process
		{env("WATCHDOG_USEC", "soon"), 0, true},
		{env("WATCHDOG_USEC", "0"), 0, true},
	} {
		got, err := watchdogInterval(tc.env)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("%q: %v, %v", tc.env("WATCHDOG_USEC"), got, err)
		}
	}
}

// The watchdog pings only while every loop makes progress: a stalled loop
// stops the pings (systemd then restarts controld), its recovery resumes
// them.
func TestWatchdogFollowsHealth(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	hc := health.New()
	loop := hc.Loop("test loop", 250*time.Millisecond)
	stalled := make(chan bool)
	go func() { // the loop under watch: beats until told to stall
		beat := true
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case b, ok := <-stalled:
				if !ok {
					return
				}
				beat = !b
			case <-tk.C:
				if beat {
					loop.Beat()
				}
			}
		}
	}()
	defer close(stalled)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchdog(ctx, 40*time.Millisecond, hc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	defer func() { cancel(); <-done }()

	// Waits are bounded by generous deadlines, not fixed windows: on a
	// loaded host the watchdog's ticks and the loop's beats come late.
	read := func(until time.Time) (ping, ok bool) {
		buf := make([]byte, 64)
		c.SetReadDeadline(until)
		k, err := c.Read(buf)
		if err != nil {
			return false, false
		}
		return string(buf[:k]) == "WATCHDOG=1", true
	}
	pings := func(want int) {
		t.Helper()
		end := time.Now().Add(10 * time.Second)
		for n := 0; n < want; {
			ping, ok := read(end)
			if !ok {
				t.Fatalf("%d of %d pings in 10 s", n, want)
			}
			if ping {
				n++
			}
		}
	}
	quiet := func(gap time.Duration) { // the first gap of this length
		t.Helper()
		end := time.Now().Add(10 * time.Second)
		for time.Now().Before(end) {
			if _, ok := read(time.Now().Add(gap)); !ok {
				return
			}
		}
		t.Fatalf("no %v without pings in 10 s", gap)
	}
	pings(3) // healthy
	stalled <- true
	quiet(300 * time.Millisecond) // past the loop's bound
	if ping, _ := read(time.Now().Add(500 * time.Millisecond)); ping {
		t.Fatal("a ping while the loop is stalled")
	}
	stalled <- false
	pings(3) // recovered
}
