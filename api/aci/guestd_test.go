//go:build linux

package aci_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// The real-guestd tests build ../../guestd/cmd/guestd and run it with
// --no-supervise against an Xvfb + openbox they start. They skip (with the
// reason) while guestd does not build or Xvfb is missing; with
// FORKFLEET_INTEGRATION=1 a missing Xvfb fails instead. Once guestd builds
// and the display is up, every failure is a failure.

type realGuest struct {
	url string
}

var (
	guestdOnce sync.Once
	guestdBin  string
	guestdErr  error
)

func buildGuestd(t *testing.T) string {
	guestdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "aci-guestd")
		if err != nil {
			guestdErr = err
			return
		}
		cleanups = append(cleanups, func() { os.RemoveAll(dir) })
		bin := filepath.Join(dir, "guestd")
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/guestd")
		cmd.Dir = filepath.Join("..", "..", "guestd")
		out, err := cmd.CombinedOutput()
		if err != nil {
			guestdErr = fmt.Errorf("go build ./cmd/guestd: %v\n%s", err, out)
			return
		}
		guestdBin = bin
	})
	if guestdErr != nil {
		t.Skipf("real guestd unavailable (it does not build yet): %v", guestdErr)
	}
	return guestdBin
}

func startProc(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	return startProcFiles(t, nil, name, args...)
}

func startProcFiles(t *testing.T, files []*os.File, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, logBuf.String())
		}
	})
	return cmd
}

func startRealGuest(t *testing.T) *realGuest {
	t.Helper()
	integration := os.Getenv("FORKFLEET_INTEGRATION") == "1"
	if _, err := exec.LookPath("Xvfb"); err != nil {
		if integration {
			t.Fatalf("FORKFLEET_INTEGRATION=1 but Xvfb is missing: %v", err)
		}
		t.Skipf("Xvfb not installed: %v", err)
	}
	bin := buildGuestd(t)

	// -displayfd: Xvfb picks a free display and writes its number once it
	// accepts connections, so neither a stale socket nor another test's
	// server can confuse us.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	startProcFiles(t, []*os.File{pw}, "Xvfb", "-displayfd", "3", "-screen", "0", "1280x800x24", "-nolisten", "tcp",
		"+extension", "XTEST", "+extension", "DAMAGE", "+extension", "XFIXES", "+extension", "MIT-SHM")
	pw.Close()
	numCh := make(chan string, 1)
	go func() {
		defer pr.Close()
		// Xvfb writes the number and the newline separately and dies if
		// the pipe is gone in between: read the whole line.
		line, _ := bufio.NewReader(pr).ReadString('\n')
		numCh <- strings.TrimSpace(line)
	}()
	var display string
	select {
	case display = <-numCh:
	case <-time.After(15 * time.Second):
		t.Fatal("Xvfb did not report a display")
	}
	if display == "" {
		t.Fatal("Xvfb exited without a display")
	}
	deadline := time.Now().Add(10 * time.Second)
	// What guestd does itself when it supervises: a window manager and a
	// painted root (openbox leaves it black, which reads as "not painted").
	disp := "DISPLAY=:" + display
	if _, err := exec.LookPath("openbox"); err == nil {
		startProc(t, "env", disp, "openbox")
	}
	paintRoot := func() {
		if out, err := exec.Command("env", disp, "xsetroot", "-solid", "#2f3b4c").CombinedOutput(); err != nil {
			t.Logf("xsetroot: %v %s", err, out)
		}
	}
	paintRoot()
	addrFile := filepath.Join(t.TempDir(), "addr")
	startProc(t, bin, "--display", ":"+display, "--no-supervise", "--insecure-no-auth",
		"--listen-tcp", "127.0.0.1:0", "--addr-file", addrFile, "--log-level", "warn")
	var g *realGuest
	for g == nil {
		if b, err := os.ReadFile(addrFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
			g = &realGuest{url: "ws://" + strings.TrimSpace(string(b)) + "/aci"}
			break
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("guestd did not write its address")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// openbox may clear the root as it starts, after our first xsetroot:
	// repaint until guestd sees the desktop ready.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	probe, err := aci.Dial(ctx, g.url, "")
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	for {
		r, err := probe.Ready(ctx)
		if err != nil {
			t.Fatalf("guestd never became ready: %v", err)
		}
		if r.GetReady() {
			return g
		}
		if r.GetWmUp() && !r.GetRootPainted() {
			paintRoot()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRealGuestd(t *testing.T) {
	g := startRealGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := aci.Dial(ctx, g.url, "", aci.WithClientName("api-aci-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := s.Welcome()
	// Screen is absent while guestd has not reached the display yet.
	if w.GetProtocolVersion() != 1 || w.GetBootId() == "" || (w.GetScreen() != nil && w.GetScreen().GetWidth() != 1280) {
		t.Fatalf("welcome = %v", w)
	}
	if !s.HasCapability("dedup") {
		t.Fatalf("guestd does not negotiate dedup: %v", w.GetCapabilities())
	}

	t.Run("WaitReady", func(t *testing.T) {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		r, err := s.WaitReady(wctx)
		if err != nil {
			t.Fatal(err)
		}
		if !r.GetReady() || !r.GetXUp() {
			t.Fatalf("ready = %v", r)
		}
	})

	t.Run("ScreenshotAndStep", func(t *testing.T) {
		r, err := s.Screenshot(ctx, aci.PNG())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetData()) < 8 || !bytes.HasPrefix(r.GetData(), []byte("\x89PNG")) || len(r.GetFrameHash()) != 16 {
			t.Fatalf("screenshot: %d bytes, hash %x", len(r.GetData()), r.GetFrameHash())
		}
		st, err := s.Step(ctx, []*aciv1.Action{aci.Move(100, 100), aci.Click(200, 210)}, aci.JPEG(80))
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range st.GetOutcomes() {
			if o.GetError() != nil {
				t.Errorf("action %d: %v", i, aci.FromProto(o.GetError()))
			}
		}
		if !bytes.HasPrefix(st.GetObservation().GetData(), []byte{0xff, 0xd8}) {
			t.Errorf("observation is not a JPEG (%v)", aci.FromProto(st.GetObservationError()))
		}
		p, err := s.CursorPosition(ctx)
		if err != nil || p.GetX() != 200 || p.GetY() != 210 {
			t.Errorf("cursor = %v, %v", p, err)
		}
		if sz, err := s.ScreenSize(ctx); err != nil || sz.GetWidth() != 1280 || sz.GetHeight() != 800 {
			t.Errorf("screen size = %v, %v", sz, err)
		}
	})

	t.Run("InvalidArgument", func(t *testing.T) {
		st, err := s.Step(ctx, []*aciv1.Action{aci.Key("definitely-not-a-key")}, nil)
		if err != nil {
			if !errors.Is(err, aci.ErrInvalidArgument) {
				t.Fatalf("err = %v", err)
			}
			return
		}
		e := aci.FromProto(st.GetOutcomes()[0].GetError())
		if !errors.Is(e, aci.ErrInvalidArgument) && !errors.Is(e, aci.ErrNotFound) {
			t.Fatalf("unknown key: outcome %v", e)
		}
	})

	t.Run("Pipelining", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				want := fmt.Appendf(nil, "p%d", i)
				r, err := s.Ping(ctx, want)
				if err != nil || !bytes.Equal(r.GetPayload(), want) {
					t.Errorf("ping %d: %v %q", i, err, r.GetPayload())
				}
			}()
		}
		wg.Wait()
	})

	t.Run("FrameCacheFleet", func(t *testing.T) {
		// N sessions observing the same settled screen: one full frame, N-1
		// not_modified.
		const n = 4
		cache := aci.NewFrameCache(0)
		var sessions []*aci.Session
		for range n {
			fs, err := aci.Dial(ctx, g.url, "", aci.WithFrameCache(cache))
			if err != nil {
				t.Fatal(err)
			}
			defer fs.Close()
			sessions = append(sessions, fs)
		}
		req := &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: 80, SettleMs: 100, SettleTimeoutMs: 2000}
		var first []byte
		for i, fs := range sessions {
			r, err := fs.Screenshot(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first = r.GetData()
				if aci.FromCache(r) {
					t.Fatal("first observation cannot be a cache hit")
				}
			} else if !aci.FromCache(r) || !bytes.Equal(r.GetData(), first) {
				t.Errorf("session %d: fromCache=%v", i, aci.FromCache(r))
			}
		}
		st := cache.Stats()
		if st.Misses != 1 || st.Hits != n-1 || st.BytesSaved != uint64((n-1)*len(first)) {
			t.Fatalf("stats = %+v, want 1 miss and %d hits", st, n-1)
		}
	})

	if s.HasCapability("exec") {
		t.Run("ExecAndCancel", func(t *testing.T) {
			r, err := s.Run(ctx, "sh", "-c", "echo hi")
			if err != nil || string(r.GetStdout()) != "hi\n" || r.GetExitCode() != 0 {
				t.Fatalf("exec = %v, %v", r, err)
			}
			cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer ccancel()
			start := time.Now()
			_, err = s.Exec(cctx, &aciv1.ExecRequest{Argv: []string{"sleep", "30"}})
			if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
				t.Fatalf("canceled exec: %v after %v", err, time.Since(start))
			}
			// The CancelRequest stopped the sleep: the session is free at once.
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			defer pcancel()
			if _, err := s.Ping(pctx, nil); err != nil {
				t.Fatalf("ping after cancel: %v", err)
			}
		})
	}

	if s.HasCapability("files") {
		t.Run("Files", func(t *testing.T) {
			dir := t.TempDir()
			data := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640 KB
			p := filepath.Join(dir, "sub", "f.bin")
			if err := s.PutFile(ctx, p, data, aci.MakeParents(), aci.ChunkSize(100<<10)); err != nil {
				t.Fatal(err)
			}
			got, err := s.GetFile(ctx, p)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("GetFile: %d bytes, %v", len(got), err)
			}
			if fi, err := s.Stat(ctx, p); err != nil || fi.GetSize() != uint64(len(data)) {
				t.Errorf("Stat = %v, %v", fi, err)
			}
			if l, err := s.List(ctx, filepath.Dir(p)); err != nil || len(l) != 1 {
				t.Errorf("List = %v, %v", l, err)
			}
			if err := s.Delete(ctx, p, false); err != nil {
				t.Error(err)
			}
			_, err = s.GetFile(ctx, p)
			var ae *aci.Error
			if !errors.Is(err, aci.ErrNotFound) || !errors.As(err, &ae) {
				t.Errorf("after delete: %v", err)
			}
		})
	}

	t.Run("Reconnect", func(t *testing.T) {
		old := s.Welcome()
		if err := s.Reconnect(ctx); err != nil {
			t.Fatal(err)
		}
		w := s.Welcome()
		if w.GetSessionId() == old.GetSessionId() || w.GetBootId() != old.GetBootId() || w.GetGeneration() != old.GetGeneration() {
			t.Errorf("after reconnect: %v (before %v)", w, old)
		}
		if _, err := s.Ping(ctx, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("JSON", func(t *testing.T) {
		js, err := aci.Dial(ctx, g.url, "", aci.WithJSON())
		if err != nil {
			t.Fatal(err)
		}
		defer js.Close()
		r, err := js.Screenshot(ctx, aci.PNG())
		if err != nil || len(r.GetData()) == 0 {
			t.Fatalf("json screenshot: %v", err)
		}
	})
}
