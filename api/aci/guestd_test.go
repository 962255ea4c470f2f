//go:build linux

package aci_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/desktoptest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// The real-guestd tests build ../../guestd/cmd/guestd and run it with
// --no-supervise against an Xvfb + openbox they start (desktoptest). They
// skip (with the reason) while Xvfb is missing; with
// FORKFLEET_INTEGRATION=1 a missing Xvfb fails instead. Once the display is
// up, every failure is a failure.

type realGuest struct {
	url string
}

// rootColor is the root openbox leaves black, painted as guestd's
// supervised session paints it (black reads as "not painted").
const rootColor = "#2f3b4c"

var registerCleanup sync.Once

func startRealGuest(t *testing.T) *realGuest {
	t.Helper()
	desktoptest.NeedXvfb(t, false)
	registerCleanup.Do(func() { cleanups = append(cleanups, desktoptest.RemoveBuilds) })
	bin := desktoptest.GuestdBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	// Each process's output, shown when the test failed once all stopped
	// (cleanups run last registered first).
	var xlog, wmlog, glog bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Xvfb output:\n%s\nopenbox output:\n%s\nguestd output:\n%s", xlog.String(), wmlog.String(), glog.String())
		}
	})
	x, err := desktoptest.StartXvfb(ctx, desktoptest.XvfbOptions{Log: &xlog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Stop)
	// What guestd does itself when it supervises: a window manager and a
	// painted root.
	env := append(os.Environ(), "DISPLAY="+x.Name())
	if openbox, err := exec.LookPath("openbox"); err == nil {
		cmd := exec.Command(openbox)
		cmd.Env = env
		wm, err := desktoptest.StartProc("openbox", cmd, &wmlog)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wm.Stop)
	}
	paintRoot := func() {
		cmd := exec.Command("xsetroot", "-solid", rootColor)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("xsetroot: %v %s", err, out)
		}
	}
	paintRoot()
	g, err := desktoptest.StartGuestd(ctx, x.Name(), bin, desktoptest.GuestdOptions{
		Args: []string{"--log-level", "warn"}, Log: &glog, Repaint: paintRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	return &realGuest{url: g.URL()}
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
