//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/rfb"
	"github.com/forkfleet/forkfleet/benchd/internal/suite"
)

// typingText is what the typing workload types, 12 characters a second.
const typingText = "forkfleet benchmarks type this line "

const typingInterval = time.Second / 12

// typist types into the focused xterm through its own ACI session and
// publishes the time each key was injected.
type typist struct {
	s    *aci.Session
	keys chan time.Time
}

func (t *typist) run(ctx context.Context) error {
	tick := time.NewTicker(typingInterval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		ch := string(typingText[i%len(typingText)])
		r, err := t.s.Step(ctx, []*aciv1.Action{aci.Type(ch)}, nil)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stepErr(r, 1); err != nil {
			return err
		}
		select {
		case t.keys <- time.Now():
		default:
		}
	}
}

// requireScreencast dials a probe session and skips unless guestd
// advertises the screencast capability.
func requireScreencast(ctx context.Context, hg *hostGuest) error {
	if !hg.Session.HasCapability("screencast") {
		return suite.Skipf("guestd does not advertise the \"screencast\" capability (welcome capabilities: %v)", hg.Session.Welcome().GetCapabilities())
	}
	return nil
}

// startX11vnc serves dt's display on a free loopback port.
func startX11vnc(ctx context.Context, dt *harness.Desktop) (*harness.Proc, string, error) {
	port, err := harness.FreePort()
	if err != nil {
		return nil, "", err
	}
	p, err := dt.Spawn("x11vnc", "x11vnc", "-display", dt.Name(), "-rfbport", strconv.Itoa(port), "-localhost",
		"-nopw", "-forever", "-shared", "-quiet")
	if err != nil {
		return nil, "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p, addr, nil
		}
		if exited, _ := p.Exited(); exited || time.Now().After(deadline) {
			p.Stop()
			return nil, "", fmt.Errorf("x11vnc did not listen on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type screencastSuite struct {
	window time.Duration
}

func (*screencastSuite) Name() string { return "screencast" }
func (*screencastSuite) Description() string {
	return "delta screencast while typing 12 chars/s: bytes per update, key-to-update latency, full frame and idle bytes, vs x11vnc over RFB (ZRLE/Tight/Raw)"
}

func (s *screencastSuite) Flags(fs *flag.FlagSet) {
	fs.DurationVar(&s.window, "screencast-window", 10*time.Second, "typing window per cell")
}

func (s *screencastSuite) Check(ctx context.Context, env *suite.Env) error {
	return checkHostGuest(env)
}

func (s *screencastSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	hg, err := startHostGuest(ctx, env)
	if err != nil {
		return nil, err
	}
	defer hg.Stop()
	if err := requireScreencast(ctx, hg); err != nil {
		return nil, err
	}
	missing := ensurePeerTools(ctx, env, map[string]string{"x11vnc": "x11vnc"})
	var rows []result.Row
	for _, sc := range []harness.Scene{harness.SceneDense, harness.SceneSparse} {
		if err := hg.Desktop.SetScene(ctx, sc, env.WorkDir); err != nil {
			return nil, err
		}
		r, err := s.ours(ctx, env, hg, string(sc), sc == harness.SceneSparse)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
		if missing["x11vnc"] {
			continue
		}
		for _, enc := range []struct {
			name string
			list []int32
		}{{"zrle", []int32{rfb.EncZRLE, rfb.EncTight, rfb.EncRaw}}, {"tight", []int32{rfb.EncTight, rfb.EncZRLE, rfb.EncRaw}}, {"raw", []int32{rfb.EncRaw}}} {
			r, err := s.peer(ctx, env, hg, string(sc), enc.name, enc.list, sc == harness.SceneSparse)
			if err != nil {
				return nil, fmt.Errorf("x11vnc %s: %w", enc.name, err)
			}
			rows = append(rows, r...)
		}
	}
	return rows, nil
}

// ours streams a delta PNG screencast at 10 fps: the first frame is the full
// frame; then (when typing) a typing window, then a 3 s idle window.
func (s *screencastSuite) ours(ctx context.Context, env *suite.Env, hg *hostGuest, content string, typing bool) ([]result.Row, error) {
	wire := &wireCounter{}
	sess, err := hg.Dial(ctx, wire)
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := sess.Events(ectx)
	id, err := sess.ScreencastStart(ctx, &aciv1.ScreencastStartRequest{Fps: 10, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Delta: true})
	if err != nil {
		return nil, fmt.Errorf("screencast start: %w", err)
	}
	defer sess.ScreencastStop(context.WithoutCancel(ctx), id)
	lbl := labels("system", "forkfleet", "encoding", "delta-png", "content", content)
	full := result.NewSeries("screencast.full_frame", "bytes", lbl)
	frameBytes := func(f *aciv1.ScreencastFrame) int {
		n := 0
		for _, t := range f.GetTiles() {
			n += len(t.GetData())
		}
		return n
	}
	first, err := nextFrame(ctx, events, id, 10*time.Second)
	if err != nil {
		return nil, err
	}
	full.Add(float64(frameBytes(first)))
	rows := []result.Row{full.Row()}
	if typing {
		per := result.NewSeries("screencast.update_bytes", "bytes", lbl)
		lat := result.NewSeries("screencast.key_to_update", "ms", lbl)
		w0 := wire.Total()
		tsess, err := hg.Dial(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tsess.Close()
		ty := &typist{s: tsess, keys: make(chan time.Time, 64)}
		tctx, tcancel := context.WithTimeout(ctx, s.window)
		var tErr error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); tErr = ty.run(tctx) }()
		var pending []time.Time
		t0 := time.Now()
	loop:
		for {
			select {
			case <-tctx.Done():
				break loop
			case k := <-ty.keys:
				pending = append(pending, k)
			case ev, ok := <-events:
				if !ok {
					break loop
				}
				f := ev.GetFrame()
				if f == nil || f.GetStreamId() != id {
					continue
				}
				now := time.Now()
				per.Add(float64(frameBytes(f)))
				// Drain keys injected before this frame arrived; the oldest
				// one's latency is key-to-first-update.
				for drained := false; !drained; {
					select {
					case k := <-ty.keys:
						pending = append(pending, k)
					default:
						drained = true
					}
				}
				if len(pending) > 0 {
					lat.Add(suite.Ms(now.Sub(pending[0])))
					pending = pending[:0]
				}
			}
		}
		tcancel()
		wg.Wait()
		if tErr != nil {
			return nil, fmt.Errorf("typing: %w", tErr)
		}
		el := time.Since(t0).Seconds()
		rate := result.Single("screencast.typing_wire_rate", "bytes/s", lbl, float64(wire.Total()-w0)/el)
		rate.Better = result.BetterLower
		rows = append(rows, per.Row(), lat.Row(), rate)
	}
	// Idle: nothing changes, nothing should be sent.
	time.Sleep(500 * time.Millisecond)
	w0 := wire.Total()
	time.Sleep(3 * time.Second)
	rows = append(rows, result.Single("screencast.idle_bytes_3s", "bytes", lbl, float64(wire.Total()-w0)))
	return rows, nil
}

func nextFrame(ctx context.Context, events <-chan *aciv1.Event, id uint32, timeout time.Duration) (*aciv1.ScreencastFrame, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			return nil, errors.New("no screencast frame within " + timeout.String())
		case ev, ok := <-events:
			if !ok {
				return nil, errors.New("session closed")
			}
			if f := ev.GetFrame(); f != nil && f.GetStreamId() == id {
				return f, nil
			}
		}
	}
}

// peer measures x11vnc with the RFB client: one outstanding incremental
// request at a time, at most 10 requests a second.
func (s *screencastSuite) peer(ctx context.Context, env *suite.Env, hg *hostGuest, content, encName string, encs []int32, typing bool) ([]result.Row, error) {
	p, addr, err := startX11vnc(ctx, hg.Desktop)
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	c, err := rfb.Dial(addr, 10*time.Second, encs...)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	lbl := labels("system", "x11vnc", "encoding", encName, "content", content)
	full := result.NewSeries("screencast.full_frame", "bytes", lbl)
	full.Baseline = true
	if err := c.Request(false); err != nil {
		return nil, err
	}
	u, err := c.ReadUpdate(time.Now().Add(30 * time.Second))
	if err != nil {
		return nil, err
	}
	full.Add(float64(u.Bytes))
	rows := []result.Row{full.Row()}
	poll := func(d time.Duration, onUpdate func(rfb.Update)) (int64, error) {
		var total int64
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			reqAt := time.Now()
			if err := c.Request(true); err != nil {
				return total, err
			}
			// x11vnc holds an incremental request until something changes:
			// wait at most until the window ends.
			u, err := c.ReadUpdate(end.Add(500 * time.Millisecond))
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					return total, nil
				}
				return total, err
			}
			total += u.Bytes
			if u.Rects > 0 && onUpdate != nil {
				onUpdate(u)
			}
			if rest := 100*time.Millisecond - time.Since(reqAt); rest > 0 {
				time.Sleep(rest)
			}
		}
		return total, nil
	}
	if typing {
		per := result.NewSeries("screencast.update_bytes", "bytes", lbl)
		lat := result.NewSeries("screencast.key_to_update", "ms", lbl)
		per.Baseline, lat.Baseline = true, true
		tsess, err := hg.Dial(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tsess.Close()
		ty := &typist{s: tsess, keys: make(chan time.Time, 64)}
		tctx, tcancel := context.WithTimeout(ctx, s.window)
		var tErr error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); tErr = ty.run(tctx) }()
		var mu sync.Mutex
		var pending []time.Time
		stopKeys := make(chan struct{})
		go func() {
			for {
				select {
				case k := <-ty.keys:
					mu.Lock()
					pending = append(pending, k)
					mu.Unlock()
				case <-stopKeys:
					return
				}
			}
		}()
		t0 := time.Now()
		total, err := poll(s.window, func(u rfb.Update) {
			per.Add(float64(u.Bytes))
			mu.Lock()
			if len(pending) > 0 {
				lat.Add(suite.Ms(u.Received.Sub(pending[0])))
				pending = pending[:0]
			}
			mu.Unlock()
		})
		tcancel()
		wg.Wait()
		close(stopKeys)
		if err != nil {
			return nil, err
		}
		if tErr != nil {
			return nil, fmt.Errorf("typing: %w", tErr)
		}
		rate := result.Single("screencast.typing_wire_rate", "bytes/s", lbl, float64(total)/time.Since(t0).Seconds())
		rate.Better, rate.Baseline = result.BetterLower, true
		rows = append(rows, per.Row(), lat.Row(), rate)
	}
	time.Sleep(500 * time.Millisecond)
	idle, err := poll(3*time.Second, nil)
	if err != nil {
		return nil, err
	}
	ir := result.Single("screencast.idle_bytes_3s", "bytes", lbl, float64(idle))
	ir.Baseline = true
	return append(rows, ir), nil
}

// guestCPUSuite measures what streaming costs in guest CPU: guestd and
// Xvfb from /proc/<pid>/stat, against x11vnc serving the same display.
type guestCPUSuite struct {
	window time.Duration
	fpsSet intList
}

func (*guestCPUSuite) Name() string { return "guestcpu" }
func (*guestCPUSuite) Description() string {
	return "guest CPU of guestd+Xvfb while idle, streaming idle and streaming while typing at 5/10/30 fps, vs x11vnc with a client connected"
}

func (g *guestCPUSuite) Flags(fs *flag.FlagSet) {
	g.fpsSet = intList{5, 10, 30}
	fs.DurationVar(&g.window, "guestcpu-window", 10*time.Second, "measured window per cell")
	fs.Var(&g.fpsSet, "guestcpu-fps", "screencast frame rates")
}

func (g *guestCPUSuite) Check(ctx context.Context, env *suite.Env) error { return checkHostGuest(env) }

func (g *guestCPUSuite) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	hg, err := startHostGuest(ctx, env)
	if err != nil {
		return nil, err
	}
	defer hg.Stop()
	if err := requireScreencast(ctx, hg); err != nil {
		return nil, err
	}
	missing := ensurePeerTools(ctx, env, map[string]string{"x11vnc": "x11vnc"})
	if err := hg.Desktop.SetScene(ctx, harness.SceneSparse, env.WorkDir); err != nil {
		return nil, err
	}
	gpid, xpid := strconv.Itoa(hg.Guestd.Proc.Pid()), strconv.Itoa(hg.Desktop.Xvfb.Pid())
	var rows []result.Row
	measure := func(system, workload string, fps int, pids map[string]string, typing bool, baseline bool) error {
		names := []string{}
		list := []string{}
		for n, p := range pids {
			names, list = append(names, n), append(list, p)
		}
		var ty *typist
		var wg sync.WaitGroup
		tctx, tcancel := context.WithCancel(ctx)
		defer tcancel()
		var tErr error
		if typing {
			ts, err := hg.Dial(ctx, nil)
			if err != nil {
				return err
			}
			defer ts.Close()
			ty = &typist{s: ts, keys: make(chan time.Time, 1024)}
			wg.Add(1)
			go func() { defer wg.Done(); tErr = ty.run(tctx) }()
		}
		m, err := StartCPU(list...)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(g.window):
		}
		pct, _, err := m.Percent()
		tcancel()
		wg.Wait()
		if err != nil {
			return err
		}
		if tErr != nil {
			return fmt.Errorf("typing: %w", tErr)
		}
		sum := 0.0
		for i, n := range names {
			r := result.Single("guestcpu.cpu", "percent", labels("system", system, "proc", n, "workload", workload, "fps", itoa(fps)), pct[i])
			r.Baseline = baseline
			rows = append(rows, r)
			sum += pct[i]
		}
		r := result.Single("guestcpu.cpu", "percent", labels("system", system, "proc", "total", "workload", workload, "fps", itoa(fps)), sum)
		r.Baseline = baseline
		rows = append(rows, r)
		env.Progressf("guestcpu: %s %s fps=%d: %.2f%% of a core", system, workload, fps, sum)
		return nil
	}
	ours := map[string]string{"guestd": gpid, "Xvfb": xpid}
	time.Sleep(time.Second)
	if err := measure("forkfleet", "idle-no-stream", 0, ours, false, false); err != nil {
		return nil, err
	}
	for _, fps := range g.fpsSet {
		sess, err := hg.Dial(ctx, nil)
		if err != nil {
			return nil, err
		}
		drain, dcancel := context.WithCancel(ctx)
		events := sess.Events(drain)
		go func() {
			for range events {
			}
		}()
		id, err := sess.ScreencastStart(ctx, &aciv1.ScreencastStartRequest{Fps: uint32(fps), Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Delta: true})
		if err != nil {
			dcancel()
			sess.Close()
			return nil, fmt.Errorf("screencast start: %w", err)
		}
		time.Sleep(time.Second)
		err = measure("forkfleet", "stream-idle", fps, ours, false, false)
		if err == nil {
			err = measure("forkfleet", "stream-typing", fps, ours, true, false)
		}
		sess.ScreencastStop(ctx, id)
		dcancel()
		sess.Close()
		if err != nil {
			return nil, err
		}
	}
	if !missing["x11vnc"] {
		p, addr, err := startX11vnc(ctx, hg.Desktop)
		if err != nil {
			return nil, err
		}
		c, err := rfb.Dial(addr, 10*time.Second, rfb.EncZRLE, rfb.EncTight, rfb.EncRaw)
		if err != nil {
			p.Stop()
			return nil, err
		}
		// Keep one incremental request outstanding at <= 10/s, as a viewer.
		cctx, ccancel := context.WithCancel(ctx)
		go func() {
			for cctx.Err() == nil {
				t0 := time.Now()
				if c.Request(true) != nil {
					return
				}
				if _, err := c.ReadUpdate(time.Now().Add(time.Hour)); err != nil {
					return
				}
				if rest := 100*time.Millisecond - time.Since(t0); rest > 0 {
					time.Sleep(rest)
				}
			}
		}()
		peerPids := map[string]string{"x11vnc": strconv.Itoa(p.Pid()), "Xvfb": xpid, "guestd": gpid}
		time.Sleep(time.Second)
		err = measure("x11vnc", "stream-idle", 10, peerPids, false, true)
		if err == nil {
			err = measure("x11vnc", "stream-typing", 10, peerPids, true, true)
		}
		ccancel()
		c.Close()
		p.Stop()
		if err != nil {
			return nil, err
		}
		env.Notef("x11vnc rows include guestd because the typing workload is injected through guestd in both systems")
	}
	return rows, nil
}
