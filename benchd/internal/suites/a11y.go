//go:build linux

package suites

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// a11yPage is the a11y suite's workload: about 1,000 accessible nodes (120
// rows of links, text, checkboxes, buttons and selects).
//
//go:embed testdata/a11y_page.html
var a11yPage []byte

// pyatspiDump is the peer: a pyatspi walk of the desktop as OSWorld's
// server does it, run inside the sandbox on the same bus.
//
//go:embed testdata/pyatspi_dump.py
var pyatspiDump []byte

// a11ySuite measures a11y_tree on the web desktop: the whole desktop's tree
// with the page open, the focused window's, a GTK app's window (l3afpad),
// and the pyatspi dump of the same desktop in the same run.
type a11ySuite struct {
	image string
	n     int
	peerN int
	peer  bool
}

func (*a11ySuite) Name() string { return "a11y" }
func (*a11ySuite) Description() string {
	return "accessibility tree (a11y_tree) of the web desktop with a ~1,000-node page: full tree, focused window, a GTK app's window, showing only, right after a scroll; p50/p99, nodes/s, bytes; pyatspi dump peer in the sandbox"
}
func (a *a11ySuite) Flags(fs *flag.FlagSet) {
	fs.StringVar(&a.image, "a11y-image", "localhost/forkfleet/desktop-web:latest", "the web desktop image (make image-web)")
	fs.IntVar(&a.n, "a11y-n", 50, "trees per cell (--n overrides)")
	fs.IntVar(&a.peerN, "a11y-peer-n", 5, "pyatspi dumps")
	fs.BoolVar(&a.peer, "a11y-pyatspi", true, "also measure the pyatspi dump (python3-pyatspi in the image)")
}
func (a *a11ySuite) Check(ctx context.Context, env *suiteapi.Env) error {
	return checkControld(ctx, env)
}

func (a *a11ySuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	n, warm := env.Samples(a.n), env.Warmups(3)
	cr, err := c.createImage(ctx, a.image)
	if err != nil {
		return nil, fmt.Errorf("boot %s: %w (make image-web builds it)", a.image, err)
	}
	defer c.remove(ctx, cr.GetSandbox().GetId())
	s, err := dialEndpoint(ctx, cr.GetEndpoint())
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if _, err := s.WaitReady(ctx); err != nil {
		return nil, err
	}
	if err := s.PutFile(ctx, "/tmp/a11y.html", a11yPage); err != nil {
		return nil, err
	}
	if _, err := s.Step(ctx, []*aciv1.Action{aci.Key("ctrl", "l"), aci.Wait(300 * time.Millisecond),
		aci.Type("file:///tmp/a11y.html"), aci.Key("Return")}, nil); err != nil {
		return nil, err
	}
	if err := waitTitle(ctx, s, func(t string) bool { return strings.HasPrefix(t, "a11y bench ready") }); err != nil {
		return nil, err
	}
	// The renderer builds its tree after the load: wait until the node
	// count holds still.
	nodes, err := settleTree(ctx, s)
	if err != nil {
		return nil, err
	}
	env.Progressf("a11y: page open, desktop tree of %d nodes", nodes)

	// Timeouts far above what a tree takes: every sample is a whole tree
	// (a partial one counts as failed).
	req := func(r *aciv1.A11YTreeRequest) *aciv1.A11YTreeRequest {
		r.TimeoutMs, r.AppTimeoutMs = 30_000, 30_000
		return r
	}
	var rows []result.Row
	full := req(&aciv1.A11YTreeRequest{})
	rows = append(rows, a.cell(ctx, env, s, "desktop", full, n, warm)...)
	rows = append(rows, a.cell(ctx, env, s, "focused_window", req(&aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW}), n, warm)...)
	rows = append(rows, a.cell(ctx, env, s, "desktop_showing", req(&aciv1.A11YTreeRequest{ShowingOnly: true}), n, warm)...)
	// An unchanged tree with if_none_match: what a step's observe_tree costs
	// when nothing changed.
	last, err := s.A11yTree(ctx, full)
	if err != nil {
		return nil, err
	}
	rows = append(rows, a.cell(ctx, env, s, "desktop_not_modified", req(&aciv1.A11YTreeRequest{IfNoneMatch: last.GetTreeHash()}), n, warm)...)
	// The page scrolled by a wheel notch (down, then up) before each tree:
	// elements come into view without an event, so guestd's tree cache
	// sees the showing elements moved and asks every element its states.
	scroll := func(i int) error {
		dy := 1
		if i%2 == 1 {
			dy = -1
		}
		_, err := s.Step(ctx, []*aciv1.Action{aci.Scroll(640, 500, 0, dy), aci.Wait(100 * time.Millisecond)}, nil)
		return err
	}
	rows = append(rows, a.cellAfter(ctx, env, s, "desktop_scrolled", full, n, warm, scroll)...)

	var peerRows []result.Row
	if a.peer {
		if peerRows, err = a.pyatspi(ctx, env, s, nodes); err != nil {
			return nil, err
		}
		rows = append(rows, peerRows...)
	}

	// A GTK app's window: l3afpad, focused.
	if _, err := s.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"/usr/bin/l3afpad"}}); err != nil {
		return nil, err
	}
	if err := waitTitle(ctx, s, func(t string) bool { return strings.Contains(t, "Untitled") }); err != nil {
		return nil, fmt.Errorf("l3afpad: %w", err)
	}
	var gtkWin uint32
	ws, err := s.ListWindows(ctx)
	if err != nil {
		return nil, err
	}
	for _, w := range ws {
		if strings.Contains(w.GetTitle(), "Untitled") {
			gtkWin = w.GetId()
		}
	}
	gtkReq := req(&aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_WINDOW, WindowId: gtkWin})
	if _, err := waitTreeNodes(ctx, s, gtkReq, 10); err != nil {
		return nil, fmt.Errorf("l3afpad's tree: %w", err)
	}
	rows = append(rows, a.cell(ctx, env, s, "gtk_window", gtkReq, n, warm)...)
	rows = append(rows, a11yRatios(rows)...)
	return rows, nil
}

// cell measures one tree request n times: the round trip at the client,
// guestd's own time, nodes, bytes on the wire and nodes per second.
func (a *a11ySuite) cell(ctx context.Context, env *suiteapi.Env, s *aci.Session, root string, req *aciv1.A11YTreeRequest, n, warm int) []result.Row {
	return a.cellAfter(ctx, env, s, root, req, n, warm, nil)
}

// cellAfter is cell with each tree asked after before(i) (untimed).
func (a *a11ySuite) cellAfter(ctx context.Context, env *suiteapi.Env, s *aci.Session, root string, req *aciv1.A11YTreeRequest, n, warm int, before func(i int) error) []result.Row {
	lbl := labels("root", root)
	rt := result.NewSeries("a11y.tree", "ms", lbl)
	guest := result.NewSeries("a11y.tree_guestd", "ms", lbl)
	nodes := result.NewSeries("a11y.tree_nodes", "count", lbl)
	size := result.NewSeries("a11y.tree_bytes", "bytes", lbl)
	rate := result.NewSeries("a11y.tree_nodes_per_s", "nodes/s", lbl)
	rate.Better = "higher"
	for i := 0; i < warm+n; i++ {
		if before != nil {
			if err := before(i); err != nil {
				rt.Fail()
				env.Progressf("a11y %s: %v", root, err)
				continue
			}
		}
		t0 := time.Now()
		r, err := s.A11yTree(ctx, req)
		d := time.Since(t0)
		switch {
		case i < warm:
			rt.Warmup()
			continue
		case err != nil || r.GetPartial():
			rt.Fail()
			env.Progressf("a11y %s: %v (partial %v)", root, err, r.GetPartial())
			continue
		}
		rt.Add(suiteapi.Ms(d))
		guest.Add(float64(r.GetDurationNs()) / 1e6)
		nodes.Add(float64(len(r.GetNodes())))
		size.Add(float64(proto.Size(&aciv1.ServerMessage{Id: 1, Reply: &aciv1.ServerMessage_A11YTree{A11YTree: r}})))
		if len(r.GetNodes()) > 0 {
			rate.Add(float64(len(r.GetNodes())) / d.Seconds())
		}
	}
	env.Progressf("a11y %s: p50 %.1f ms", root, p50Of(rt))
	return []result.Row{rt.Row(), guest.Row(), nodes.Row(), size.Row(), rate.Row()}
}

// pyatspi runs the peer dump inside the sandbox (python3-pyatspi in the
// image), peerN rounds in one process, and checks it saw about as many
// nodes as guestd's tree.
func (a *a11ySuite) pyatspi(ctx context.Context, env *suiteapi.Env, s *aci.Session, ours int) ([]result.Row, error) {
	if err := s.PutFile(ctx, "/tmp/pyatspi_dump.py", pyatspiDump); err != nil {
		return nil, err
	}
	r, err := s.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"/usr/bin/python3", "/tmp/pyatspi_dump.py", strconv.Itoa(a.peerN + 1)},
		TimeoutMs: 600_000})
	if err != nil {
		return nil, err
	}
	if r.GetExitCode() != 0 {
		return nil, fmt.Errorf("pyatspi dump (python3-pyatspi in %s): exit %d: %s", a.image, r.GetExitCode(), r.GetStderr())
	}
	lbl := labels("root", "desktop", "peer", "pyatspi")
	dump := result.NewSeries("peer.pyatspi_tree", "ms", lbl)
	dump.Baseline = true
	nodes := result.NewSeries("peer.pyatspi_tree_nodes", "count", lbl)
	nodes.Baseline = true
	sc := bufio.NewScanner(bytes.NewReader(r.GetStdout()))
	for i := 0; sc.Scan(); i++ {
		var line struct {
			Nodes int
			MS    float64
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return nil, fmt.Errorf("pyatspi dump output %q: %w", sc.Text(), err)
		}
		if i == 0 {
			dump.Warmup() // its first walk fills libatspi's caches
			continue
		}
		dump.Add(line.MS)
		nodes.Add(float64(line.Nodes))
		env.Progressf("pyatspi dump %d: %d nodes in %.0f ms", i, line.Nodes, line.MS)
	}
	if dump.Len() == 0 {
		return nil, errors.New("pyatspi dump printed nothing")
	}
	if got := nodes.Values()[0]; got < float64(ours)/2 || got > float64(ours)*2 {
		env.Notef("pyatspi walked %.0f nodes where a11y_tree has %d", got, ours)
	}
	return []result.Row{dump.Row(), nodes.Row()}, nil
}

// a11yRatios: pyatspi's dump over a11y_tree's full desktop tree, p50.
func a11yRatios(rows []result.Row) []result.Row {
	var ours, peer *float64
	for _, r := range rows {
		switch {
		case r.Metric == "a11y.tree" && r.Labels["root"] == "desktop":
			ours = r.P50
		case r.Metric == "peer.pyatspi_tree":
			peer = r.P50
		}
	}
	if ours == nil || peer == nil || *ours <= 0 {
		return nil
	}
	return []result.Row{result.Single("a11y.speedup_vs_pyatspi", "x", labels("root", "desktop"), *peer / *ours)}
}

func p50Of(s *result.Series) float64 {
	if r := s.Row(); r.P50 != nil {
		return *r.P50
	}
	return 0
}

// settleTree waits until the desktop tree's node count is the same three
// times in a row (the renderer builds it after the load) and returns it.
func settleTree(ctx context.Context, s *aci.Session) (int, error) {
	deadline := time.Now().Add(60 * time.Second)
	last, same := -1, 0
	for time.Now().Before(deadline) {
		r, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{TimeoutMs: 30_000, AppTimeoutMs: 30_000})
		if err != nil {
			return 0, err
		}
		if n := len(r.GetNodes()); n == last && n > 100 && !r.GetPartial() {
			if same++; same >= 3 {
				return n, nil
			}
		} else {
			last, same = n, 0
		}
		time.Sleep(200 * time.Millisecond)
	}
	return 0, fmt.Errorf("the desktop tree did not settle in 60 s (last %d nodes)", last)
}

func waitTreeNodes(ctx context.Context, s *aci.Session, req *aciv1.A11YTreeRequest, min int) (int, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := s.A11yTree(ctx, req)
		if err == nil && len(r.GetNodes()) >= min {
			return len(r.GetNodes()), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("fewer than %d nodes after 30 s: %v", min, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
