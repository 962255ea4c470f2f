//go:build linux

package suites

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/rfb"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// guestCPUSuite measures what streaming costs in guest CPU: guestd and
// Xvfb from /proc/<pid>/stat, against x11vnc serving the same display.
type guestCPUSuite struct {
	window time.Duration
	reps   int
	fpsSet intList
}

func (*guestCPUSuite) Name() string { return "guestcpu" }
func (*guestCPUSuite) Description() string {
	return "guest CPU of guestd+Xvfb with no stream, streaming idle and streaming while typing at 5/10/30 fps (delta-zlib, damage-gated), vs x11vnc+Xvfb with a viewer connected (poll-based capture)"
}

func (g *guestCPUSuite) Flags(fs *flag.FlagSet) {
	g.fpsSet = intList{5, 10, 30}
	fs.DurationVar(&g.window, "guestcpu-window", 10*time.Second, "measured window per sample")
	fs.IntVar(&g.reps, "guestcpu-reps", 3, "windows (samples) per cell")
	fs.Var(&g.fpsSet, "guestcpu-fps", "screencast frame rates")
}

// Peers: x11vnc, whose capture polls the screen.
func (g *guestCPUSuite) Peers() []string { return []string{"x11vnc"} }

func (g *guestCPUSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	if g.window < time.Second || g.reps < 1 {
		return fmt.Errorf("guestcpu: --guestcpu-window must be >= 1s and --guestcpu-reps >= 1")
	}
	for _, f := range g.fpsSet {
		if f < 1 || f > 60 {
			return fmt.Errorf("guestcpu: fps %d outside 1..60", f)
		}
	}
	return checkHostGuest(env)
}

// cpuCell is one (system, workload, fps) cell: per-process series over
// g.reps windows.
type cpuCell struct {
	lbl      map[string]string
	baseline bool
	procs    []string // names, in pid order
	pids     []string
	// totals are the named sums of procs reported besides each process.
	totals map[string][]string
	series map[string]*result.Series
	frames *result.Series // frames delivered in the window (streams only)
}

func newCPUCell(lbl map[string]string, baseline bool, procs, pids []string, totals map[string][]string, stream bool) *cpuCell {
	c := &cpuCell{lbl: lbl, baseline: baseline, procs: procs, pids: pids, totals: totals, series: map[string]*result.Series{}}
	add := func(name string) {
		l := map[string]string{"proc": name}
		for k, v := range lbl {
			l[k] = v
		}
		s := result.NewSeries("guestcpu.cpu", "percent", l)
		s.Baseline = baseline
		c.series[name] = s
	}
	for _, p := range procs {
		add(p)
	}
	for t := range totals {
		add(t)
	}
	if stream {
		c.frames = result.NewSeries("guestcpu.frames", "frames", lbl)
		c.frames.Baseline = baseline
	}
	return c
}

func (c *cpuCell) rows() []result.Row {
	var out []result.Row
	for _, p := range c.procs {
		out = append(out, c.series[p].Row())
	}
	for _, t := range sortedKeys(c.totals) {
		out = append(out, c.series[t].Row())
	}
	if c.frames != nil {
		out = append(out, c.frames.Row())
	}
	return out
}

func sortedKeys(m map[string][]string) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func (g *guestCPUSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	hg, err := startHostGuest(ctx, env)
	if err != nil {
		return nil, err
	}
	defer hg.Stop()
	if err := requireScreencast(ctx, hg); err != nil {
		return nil, err
	}
	x11vnc, haveX11vnc := env.Peer("x11vnc")
	env.Notef("guestd has no switch to turn X DAMAGE gating off (no flag or environment variable), so no poll-diff guestd cells: " +
		"the poll-based peer is x11vnc with a viewer keeping an incremental request outstanding (its default screen polling, XDAMAGE as hints), label capture=poll")
	env.Notef("typing is injected through guestd in every workload: guestd's share of x11vnc cells is input injection only; compare forkfleet total (guestd+Xvfb) with x11vnc total-with-injector (x11vnc+Xvfb+guestd)")
	gpid, xpid := strconv.Itoa(hg.Guestd.Proc.Pid()), strconv.Itoa(hg.Desktop.Xvfb.Pid())
	var rows []result.Row

	// window measures one sample of every process of c; frames counts the
	// stream's frames, typing runs the typist through the window.
	window := func(c *cpuCell, typing bool, frames *atomic.Int64) error {
		tctx, tcancel := context.WithCancel(ctx)
		defer tcancel()
		tdone := make(chan error, 1)
		if typing {
			ts, err := hg.Dial(ctx, nil)
			if err != nil {
				return err
			}
			defer ts.Close()
			ty := &typist{s: ts}
			go func() { tdone <- ty.run(tctx) }()
		}
		var f0 int64
		if frames != nil {
			f0 = frames.Load()
		}
		m, err := StartCPU(c.pids...)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(g.window):
		}
		pct, _, err := m.Percent()
		if err != nil {
			return err
		}
		tcancel()
		if typing {
			if err := <-tdone; err != nil {
				return fmt.Errorf("typing: %w", err)
			}
		}
		byName := map[string]float64{}
		for i, p := range c.procs {
			byName[p] = pct[i]
			c.series[p].Add(pct[i])
		}
		for t, parts := range c.totals {
			sum := 0.0
			for _, p := range parts {
				sum += byName[p]
			}
			c.series[t].Add(sum)
		}
		if frames != nil && c.frames != nil {
			c.frames.Add(float64(frames.Load() - f0))
		}
		return nil
	}
	cellRun := func(c *cpuCell, typing bool, frames *atomic.Int64) error {
		for i := 0; i < g.reps; i++ {
			if err := window(c, typing, frames); err != nil {
				return err
			}
		}
		rows = append(rows, c.rows()...)
		var total float64
		name := "total"
		if s, ok := c.series[name]; ok && s.Len() > 0 {
			total = median(s.Values())
		}
		env.Progressf("guestcpu: %s: total p50 %.2f%% of a core", labelString(c.lbl), total)
		return nil
	}
	ours := func(workload string, fps int, stream bool) *cpuCell {
		lbl := labels("system", "forkfleet", "workload", workload, "fps", itoa(fps), "capture", "none")
		if stream {
			lbl["capture"] = "xdamage"
		}
		return newCPUCell(lbl, false, []string{"guestd", "Xvfb"}, []string{gpid, xpid},
			map[string][]string{"total": {"guestd", "Xvfb"}}, stream)
	}

	if err := freshScene(ctx, env, hg, harness.SceneSparse); err != nil {
		return nil, err
	}
	time.Sleep(time.Second)
	if err := cellRun(ours("no-stream-idle", 0, false), false, nil); err != nil {
		return rows, err
	}
	if err := cellRun(ours("no-stream-typing", 0, false), true, nil); err != nil {
		return rows, err
	}
	zlib, _ := castModeNamed("delta-zlib")
	for _, fps := range g.fpsSet {
		if err := g.streamCells(ctx, env, hg, zlib, fps, ours, cellRun); err != nil {
			return rows, err
		}
	}
	if !haveX11vnc {
		return rows, nil
	}
	for _, tuning := range []string{"defaults", "low-latency"} {
		var extra []string
		if tuning == "low-latency" {
			extra = x11vncLowLatency
		}
		if err := g.peerCells(ctx, env, hg, x11vnc, tuning, extra, xpid, gpid, cellRun); err != nil {
			return rows, fmt.Errorf("x11vnc (%s): %w", tuning, err)
		}
	}
	env.Notef("x11vnc tuning=low-latency runs with %v, the settings that bring its key-to-update near guestd's (screencast suite)", x11vncLowLatency)
	return rows, nil
}

// peerCells runs x11vnc (with extra arguments) on a fresh scene with one
// viewer keeping an incremental request outstanding, idle then typing.
func (g *guestCPUSuite) peerCells(ctx context.Context, env *suiteapi.Env, hg *hostGuest, x11vnc, tuning string, extra []string, xpid, gpid string,
	cellRun func(*cpuCell, bool, *atomic.Int64) error) error {
	if err := freshScene(ctx, env, hg, harness.SceneSparse); err != nil {
		return err
	}
	p, addr, err := startX11vnc(ctx, hg.Desktop, x11vnc, extra...)
	if err != nil {
		return err
	}
	defer p.Stop()
	v, err := startVNC(ctx, addr, []int32{rfb.EncZRLE, rfb.EncCopyRect, rfb.EncTight, rfb.EncRaw})
	if err != nil {
		return err
	}
	defer v.close()
	var frames atomic.Int64
	go func() {
		for u := range v.updates {
			if u.content {
				frames.Add(1)
			}
		}
	}()
	time.Sleep(time.Second)
	vpid := strconv.Itoa(p.Pid())
	peer := func(workload string) *cpuCell {
		return newCPUCell(labels("system", "x11vnc", "workload", workload, "fps", "x11vnc-paced", "capture", "poll", "tuning", tuning), true,
			[]string{"x11vnc", "Xvfb", "guestd"}, []string{vpid, xpid, gpid},
			map[string][]string{"total": {"x11vnc", "Xvfb"}, "total-with-injector": {"x11vnc", "Xvfb", "guestd"}}, true)
	}
	if err := cellRun(peer("stream-idle"), false, &frames); err != nil {
		return err
	}
	return cellRun(peer("stream-typing"), true, &frames)
}

// streamCells runs the idle and typing cells of one delta-zlib stream at
// fps on a fresh scene.
func (g *guestCPUSuite) streamCells(ctx context.Context, env *suiteapi.Env, hg *hostGuest, m castMode, fps int,
	ours func(string, int, bool) *cpuCell, cellRun func(*cpuCell, bool, *atomic.Int64) error) error {
	if err := freshScene(ctx, env, hg, harness.SceneSparse); err != nil {
		return err
	}
	o, err := startOurStream(ctx, hg, m, fps)
	if err != nil {
		return err
	}
	defer o.close()
	var frames atomic.Int64
	go func() {
		for u := range o.updates {
			if u.content {
				frames.Add(1)
			}
		}
	}()
	// The keyframe and the stream's one re-check 150 ms after it start.
	time.Sleep(time.Second)
	if err := cellRun(ours("stream-idle", fps, true), false, &frames); err != nil {
		return err
	}
	return cellRun(ours("stream-typing", fps, true), true, &frames)
}
