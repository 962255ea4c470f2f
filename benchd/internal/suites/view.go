//go:build linux

package suites

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/browsertest"
	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// viewSuite measures controld's live view as a person sees it: a real
// headless Chromium opens the view page of a sandbox through the gateway on
// the loopback, and a key typed into the sandbox's xterm is timed until
// the changed pixels are on the page's canvas. The peer, in the same run,
// is x11vnc's key-to-update on the host desktop (the screencast suite's
// RFB client; the typist injects through guestd for both).
type viewSuite struct {
	window  time.Duration
	idle    time.Duration
	viewers int
	pidfile string
}

func (*viewSuite) Name() string { return "view" }
func (*viewSuite) Description() string {
	return "live view in headless Chromium through controld's gateway: key press in the sandbox to the changed pixels on the page's canvas (typing 12 chars/s into the xterm), idle viewers' bytes and controld CPU; x11vnc key-to-update (RFB ZRLE, default and low-latency tuning) as the peer in the same run"
}
func (v *viewSuite) Flags(fs *flag.FlagSet) {
	fs.DurationVar(&v.window, "view-window", 20*time.Second, "typing window")
	fs.DurationVar(&v.idle, "view-idle", 10*time.Second, "idle window, without viewers and then with --view-viewers pages open")
	fs.IntVar(&v.viewers, "view-viewers", 4, "pages open during the idle window")
	fs.StringVar(&v.pidfile, "view-controld-pidfile", "/run/forkfleet/controld.pid", "controld's pid file (deploy/controld-up.sh), for its CPU")
}

// Peers: x11vnc, the VNC server whose web clients (noVNC) other sandboxes
// hand out.
func (v *viewSuite) Peers() []string { return []string{"x11vnc"} }

func (v *viewSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	if v.window < time.Second || v.idle < time.Second || v.viewers < 1 {
		return fmt.Errorf("view: --view-window and --view-idle must be >= 1s, --view-viewers >= 1")
	}
	if _, err := browsertest.Path(); err != nil {
		return suiteapi.Skipf("%v", err)
	}
	return checkControld(ctx, env)
}

func (v *viewSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	rows, err := v.ours(ctx, env)
	if err != nil {
		return rows, err
	}
	x11vnc, ok := env.Peer("x11vnc")
	if !ok {
		env.Notef("x11vnc not installed (make peers): no peer in this run")
		return rows, nil
	}
	if err := checkHostGuest(env); err != nil {
		env.Notef("no host desktop for x11vnc: %v", err)
		return rows, nil
	}
	hg, err := startHostGuest(ctx, env)
	if err != nil {
		return rows, err
	}
	defer hg.Stop()
	sc := &screencastSuite{window: v.window, idle: 3 * time.Second}
	for _, tuning := range []string{"default", "low-latency"} {
		var extra []string
		if tuning == "low-latency" {
			extra = x11vncLowLatency
		}
		p, addr, err := startX11vnc(ctx, hg.Desktop, x11vnc, extra...)
		if err != nil {
			return rows, err
		}
		r, err := sc.peer(ctx, env, hg, addr, harness.SceneSparse, rfbEncodings[0].name, rfbEncodings[0].list, tuning)
		p.Stop()
		rows = append(rows, r...)
		if err != nil {
			return rows, fmt.Errorf("x11vnc %s: %w", tuning, err)
		}
	}
	env.Notef("view.key_to_canvas: from the moment a key's Step is sent to guestd (through the gateway) to the page's putImageData of the first frame drawn after it (the page's wall clock, performance.timeOrigin + now(), on the same host); headless Chromium composites without a display, so the next screen refresh (<= 16.7 ms at 60 Hz) is not included")
	env.Notef("view.idle_*: a still screen with the pages open (the typing page plus view-only ones): bytes received by all pages, and controld's CPU from /proc/<pid>/stat (10 ms ticks: 0 means under one tick over the window); the goals are 0 bytes and < 0.5%% of a core")
	env.Notef("screencast.key_to_update (x11vnc): the same typist through guestd on the host desktop (Xvfb, openbox, xterm) to the first byte of the first RFB update after the key; no decoding or drawing is included, which favours the peer")
	return rows, nil
}

// ours: one sandbox through the shared controld, one Chromium.
func (v *viewSuite) ours(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cr, err := c.create(ctx)
	if err != nil {
		return nil, err
	}
	id := cr.GetSandbox().GetId()
	defer c.remove(context.WithoutCancel(ctx), id)
	sess, err := dialEndpoint(ctx, cr.GetEndpoint())
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	cl := &cell{lbl: labels("system", "forkfleet", "viewer", "chromium", "content", "xterm")}

	// controld idle, no viewer: the floor for the idle rows.
	pid := v.controldPid(env)
	if pid != "" {
		time.Sleep(time.Second)
		cpu, err := cpuOver(ctx, pid, v.idle)
		if err != nil {
			return nil, err
		}
		cl.single("view.idle_controld_cpu_0_viewers", "% of a core", cpu, result.BetterLower)
	}

	path, _ := browsertest.Path()
	b, err := browsertest.Start(ctx, path)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	open := func(control bool) (*browsertest.Page, error) {
		url, _, err := c.c.Sandbox(id).ViewTicket(ctx, control, 0)
		if err != nil {
			return nil, err
		}
		p, err := b.Open(ctx, url)
		if err != nil {
			return nil, err
		}
		return p, p.WaitFor(ctx, "window.forkfleetView && forkfleetView.keyframes > 0", 30*time.Second)
	}
	page, err := open(true)
	if err != nil {
		return nil, err
	}

	// Typing: key times from the typist, frame times from the page.
	keys := make(chan time.Time, 4096)
	tctx, cancel := context.WithTimeout(ctx, v.window)
	err = (&typist{s: sess, keys: keys}).run(tctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("typing: %w", err)
	}
	time.Sleep(time.Second) // the last keys' frames
	close(keys)
	var keyTimes []time.Time
	for k := range keys {
		keyTimes = append(keyTimes, k)
	}
	out, err := page.Eval(ctx, "JSON.stringify(forkfleetView.drawn)")
	if err != nil {
		return nil, err
	}
	var drawnMs []float64
	if err := json.Unmarshal([]byte(out), &drawnMs); err != nil {
		return nil, fmt.Errorf("page frame log: %w", err)
	}
	lat := cl.series("view.key_to_canvas", "ms")
	var pairer keyPairer
	slices.Sort(drawnMs)
	k := 0
	for _, ms := range drawnMs {
		at := time.UnixMicro(int64(ms * 1000))
		for k < len(keyTimes) && keyTimes[k].Before(at) {
			pairer.key(keyTimes[k])
			k++
		}
		if d, ok := pairer.update(at); ok {
			lat.Add(suiteapi.Ms(d))
		}
	}
	for i := 0; i < pairer.unanswered()+len(keyTimes)-k; i++ {
		lat.Fail()
	}
	cl.rows = append(cl.rows, lat.Row())
	env.Progressf("view: %d keys, key-to-canvas p50 %s ms", len(keyTimes), rowP50(cl.rows, "view.key_to_canvas"))

	// Idle: viewers open on a still screen cost nothing on the wire.
	pages := []*browsertest.Page{page}
	for len(pages) < v.viewers {
		p, err := open(false)
		if err != nil {
			return cl.rows, err
		}
		pages = append(pages, p)
	}
	time.Sleep(time.Second)
	total := func() (float64, error) {
		var sum float64
		for _, p := range pages {
			s, err := p.Eval(ctx, "forkfleetView.bytes")
			if err != nil {
				return 0, err
			}
			var n float64
			fmt.Sscan(s, &n)
			sum += n
		}
		return sum, nil
	}
	b0, err := total()
	if err != nil {
		return cl.rows, err
	}
	lbl := itoa(v.viewers)
	if pid != "" {
		cpu, err := cpuOver(ctx, pid, v.idle)
		if err != nil {
			return cl.rows, err
		}
		cl.single("view.idle_controld_cpu_"+lbl+"_viewers", "% of a core", cpu, result.BetterLower)
	} else {
		time.Sleep(v.idle)
	}
	b1, err := total()
	if err != nil {
		return cl.rows, err
	}
	cl.single("view.idle_bytes_"+lbl+"_viewers", "bytes", b1-b0, result.BetterLower)
	return cl.rows, nil
}

// controldPid reads the shared controld's pid ("" with a note when it
// cannot).
func (v *viewSuite) controldPid(env *suiteapi.Env) string {
	b, err := os.ReadFile(v.pidfile)
	pid := strings.TrimSpace(string(b))
	if err == nil {
		_, err = CPUTime(pid)
	}
	if err != nil {
		env.Notef("controld's CPU not measured: %v", err)
		return ""
	}
	return pid
}

// cpuOver is pid's CPU over d, in percent of one core.
func cpuOver(ctx context.Context, pid string, d time.Duration) (float64, error) {
	m, err := StartCPU(pid)
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	p, _, err := m.Percent()
	if err != nil {
		return 0, err
	}
	return p[0], nil
}
