package suites

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/hostinfo"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// clientScale measures the client plane alone: N ACI sessions in this process
// against synthetic peers in separate processes. The Python SDK's cell runs
// the same loads in a Python process (python/bench/clientscale.py) against
// the same peers, and both clients' step latency at N=1 is measured in the
// same run.
type clientScale struct {
	sessions   intList
	frameBytes int
	peers      int
	window     time.Duration
	clients    string
	python     string
}

func (*clientScale) Name() string { return "clientscale" }
func (*clientScale) Description() string {
	return "N in {16..1024} ACI sessions in one process vs synthetic peers in separate processes: frames/s, latency, client CPU/RSS"
}

func (c *clientScale) Flags(fs *flag.FlagSet) {
	c.sessions = intList{16, 64, 256, 1024}
	fs.Var(&c.sessions, "clientscale-sessions", "session counts")
	fs.IntVar(&c.frameBytes, "clientscale-frame-bytes", 90000, "screenshot payload bytes served by the peers")
	fs.IntVar(&c.peers, "clientscale-peers", 4, "peer processes (sessions spread round-robin)")
	fs.DurationVar(&c.window, "clientscale-window", 5*time.Second, "length of one measured window")
	fs.StringVar(&c.clients, "clientscale-clients", "go,python", "clients measured: go (in process), python (the SDK in python/)")
	fs.StringVar(&c.python, "clientscale-python", "", "a python with the forkfleet package installed (default: the repo's .cache/python/bin/python, made by make python-venv)")
}

func (c *clientScale) wants(client string) bool {
	for _, x := range strings.Split(c.clients, ",") {
		if strings.TrimSpace(x) == client {
			return true
		}
	}
	return false
}

func (c *clientScale) Check(ctx context.Context, env *suiteapi.Env) error {
	if env.Self == "" {
		return suiteapi.Skipf("benchd cannot find its own executable to start peers")
	}
	return nil
}

type peerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
}

func startPeer(ctx context.Context, self string, frameBytes int) (*peerProc, error) {
	cmd := exec.Command(self, "peer", "--frame-bytes", itoa(frameBytes), "--listen", "127.0.0.1:0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start peer: %w", err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("peer did not report its address: %w", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		stdin.Close()
		cmd.Wait()
		return nil, fmt.Errorf("peer said %q", line)
	}
	return &peerProc{cmd: cmd, stdin: stdin, addr: addr}, nil
}

func (p *peerProc) stop() {
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

func (c *clientScale) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	if c.frameBytes <= 0 || c.peers <= 0 || c.window <= 0 {
		return nil, errors.New("clientscale: frame bytes, peers and window must be positive")
	}
	var py *pythonClient
	if c.wants("python") {
		var err error
		if py, err = newPythonClient(c.python, env.RepoRoot); err != nil {
			return nil, err
		}
	}
	var peers []*peerProc
	defer func() {
		for _, p := range peers {
			p.stop()
		}
	}()
	for i := 0; i < c.peers; i++ {
		p, err := startPeer(ctx, env.Self, c.frameBytes)
		if err != nil {
			return nil, err
		}
		peers = append(peers, p)
	}
	_, mhz := hostinfo.CPU()
	windows := env.Samples(3)
	var rows []result.Row
	for _, n := range c.sessions {
		if c.wants("go") {
			env.Progressf("clientscale: go, N=%d sessions, %d windows of %s", n, windows, c.window)
			r, err := c.tier(ctx, env, peers, n, windows, mhz)
			if err != nil {
				return nil, fmt.Errorf("N=%d: %w", n, err)
			}
			rows = append(rows, r...)
		}
		if py != nil {
			env.Progressf("clientscale: python, N=%d sessions, %d windows of %s", n, windows, c.window)
			r, err := c.pythonTier(ctx, env, py, peers, n, windows, mhz)
			if err != nil {
				return nil, fmt.Errorf("python N=%d: %w", n, err)
			}
			rows = append(rows, r...)
		}
	}
	r, err := c.stepLatency(ctx, env, py, peers, windows)
	if err != nil {
		return nil, err
	}
	rows = append(rows, r...)
	env.Notef("goal: >= 5,000 frames/s of 90 KB per client core (Go); the Python SDK >= 7,713 frames/s per client core and a step p50 within 0.3 ms of the Go client's at N=1; peers run in %d separate processes on the same %d-core host, so they compete with the client for CPU", c.peers, hostCores())
	return rows, nil
}

// pythonClient runs python/bench/clientscale.py with an interpreter that has
// the forkfleet package installed.
type pythonClient struct {
	python string
	script string
}

func newPythonClient(python, repoRoot string) (*pythonClient, error) {
	if repoRoot == "" {
		return nil, errors.New("clientscale: python client: run benchd inside the monorepo (python/bench/clientscale.py), or --clientscale-clients go")
	}
	if python == "" {
		python = filepath.Join(repoRoot, ".cache", "python", "bin", "python")
	}
	script := filepath.Join(repoRoot, "python", "bench", "clientscale.py")
	if out, err := exec.Command(python, "-c", "import forkfleet.aci").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("clientscale: python client: %s cannot import forkfleet (make python-venv installs it), or --clientscale-clients go: %v: %s",
			python, err, strings.TrimSpace(string(out)))
	}
	return &pythonClient{python: python, script: script}, nil
}

// pyWindow is one measured window as the Python driver reports it.
type pyWindow struct {
	Frames    int       `json:"frames"`
	Failed    int       `json:"failed"`
	WallS     float64   `json:"wall_s"`
	CPUS      float64   `json:"cpu_s"`
	RSSKB     int64     `json:"rss_kb"`
	LatencyMs []float64 `json:"latency_ms"`
}

// run starts the driver for n sessions in mode ("observe" or "step") and
// returns its windows.
func (py *pythonClient) run(ctx context.Context, peers []*peerProc, n int, mode string, windows int, window time.Duration, frameBytes int) ([]pyWindow, error) {
	addrs := make([]string, len(peers))
	for i, p := range peers {
		addrs[i] = p.addr
	}
	cmd := exec.CommandContext(ctx, py.python, py.script, "--peers", strings.Join(addrs, ","), "--sessions", itoa(n),
		"--mode", mode, "--windows", itoa(windows), "--window", strconv.FormatFloat(window.Seconds(), 'f', -1, 64),
		"--frame-bytes", itoa(frameBytes))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %s", py.script, err, strings.TrimSpace(stderr.String()))
	}
	var ws []pyWindow
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var w pyWindow
		if err := json.Unmarshal([]byte(line), &w); err != nil {
			return nil, fmt.Errorf("%s: bad window line: %v", py.script, err)
		}
		ws = append(ws, w)
	}
	if len(ws) != windows {
		return nil, fmt.Errorf("%s: %d windows reported, want %d", py.script, len(ws), windows)
	}
	return ws, nil
}

// pythonTier is tier for the Python SDK: the same rows, labelled client=python.
func (c *clientScale) pythonTier(ctx context.Context, env *suiteapi.Env, py *pythonClient, peers []*peerProc, n, windows int, mhz float64) ([]result.Row, error) {
	ws, err := py.run(ctx, peers, n, "observe", windows, c.window, c.frameBytes)
	if err != nil {
		return nil, err
	}
	lbl := labels("sessions", itoa(n), "frame_bytes", itoa(c.frameBytes), "client", "python")
	lat := result.NewSeries("clientscale.observe_latency", "ms", lbl)
	lat.DropSamples = true
	fps := result.NewSeries("clientscale.frames_per_s", "frames/s", lbl)
	cpu := result.NewSeries("clientscale.client_cpu", "percent", lbl)
	perCore := result.NewSeries("clientscale.frames_per_client_core", "frames/s", lbl)
	perGHz := result.NewSeries("clientscale.frames_per_ghz_core", "frames/s/GHz-core", lbl)
	ingest := result.NewSeries("clientscale.ingest", "Mbps", lbl)
	rss := result.NewSeries("clientscale.client_rss", "MB", lbl)
	fps.Warmup() // the driver's own warm-up second
	for i, w := range ws {
		for _, v := range w.LatencyMs {
			lat.Add(v)
		}
		for j := 0; j < w.Failed; j++ {
			lat.Fail()
		}
		rate := float64(w.Frames) / w.WallS
		pct := 100 * w.CPUS / w.WallS
		fps.Add(rate)
		cpu.Add(pct)
		if w.CPUS > 0 {
			pc := float64(w.Frames) / w.CPUS
			perCore.Add(pc)
			if mhz > 0 {
				perGHz.Add(pc / (mhz / 1000))
			}
		}
		ingest.Add(rate * float64(c.frameBytes) * 8 / 1e6)
		rss.Add(float64(w.RSSKB) / 1024)
		env.Progressf("clientscale: python N=%d window %d: %.0f frames/s, client CPU %.0f%%", n, i+1, rate, pct)
	}
	out := []result.Row{fps.Row(), lat.Row(), cpu.Row(), perCore.Row()}
	if perGHz.Len() > 0 {
		out = append(out, perGHz.Row())
	}
	return append(out, ingest.Row(), rss.Row()), nil
}

// stepLatency is one session's closed-loop Step (three actions and a JPEG
// observation of --clientscale-frame-bytes) for each client, in this run,
// and the Python client's p50 over the Go client's.
func (c *clientScale) stepLatency(ctx context.Context, env *suiteapi.Env, py *pythonClient, peers []*peerProc, windows int) ([]result.Row, error) {
	var rows []result.Row
	var goP50, pyP50 float64
	if c.wants("go") {
		env.Progressf("clientscale: go, step latency at N=1")
		s, err := aci.Dial(ctx, "ws://"+peers[0].addr+aci.DefaultUnixPath, "", aci.WithClientName("benchd-clientscale"))
		if err != nil {
			return nil, fmt.Errorf("step latency: dial: %w", err)
		}
		defer s.Close()
		series := result.NewSeries("clientscale.step_latency", "ms", labels("sessions", "1", "frame_bytes", itoa(c.frameBytes), "client", "go"))
		series.DropSamples = true
		actions := []*aciv1.Action{aci.Move(100, 100), aci.Click(200, 200), aci.Key("Return")}
		obs := aci.JPEG(80)
		for w := -1; w < windows; w++ { // window -1 is the warm-up
			d := c.window
			if w < 0 {
				d = time.Second
			}
			end := time.Now().Add(d)
			for time.Now().Before(end) {
				t0 := time.Now()
				r, err := s.Step(ctx, actions, obs)
				switch {
				case w < 0:
				case err != nil || len(r.GetObservation().GetData()) != c.frameBytes:
					series.Fail()
				default:
					series.Add(suiteapi.Ms(time.Since(t0)))
				}
			}
		}
		row := series.Row()
		if row.P50 == nil {
			return nil, errors.New("step latency: the Go client completed no step")
		}
		goP50 = *row.P50
		rows = append(rows, row)
	}
	if py != nil {
		env.Progressf("clientscale: python, step latency at N=1")
		ws, err := py.run(ctx, peers[:1], 1, "step", windows, c.window, c.frameBytes)
		if err != nil {
			return nil, fmt.Errorf("python step latency: %w", err)
		}
		series := result.NewSeries("clientscale.step_latency", "ms", labels("sessions", "1", "frame_bytes", itoa(c.frameBytes), "client", "python"))
		series.DropSamples = true
		for _, w := range ws {
			for _, v := range w.LatencyMs {
				series.Add(v)
			}
			for j := 0; j < w.Failed; j++ {
				series.Fail()
			}
		}
		row := series.Row()
		if row.P50 == nil {
			return nil, errors.New("step latency: the Python client completed no step")
		}
		pyP50 = *row.P50
		rows = append(rows, row)
	}
	if c.wants("go") && py != nil {
		diff := result.NewSeries("clientscale.step_latency_over_go", "ms", labels("sessions", "1", "frame_bytes", itoa(c.frameBytes), "client", "python"))
		diff.Add(pyP50 - goP50)
		rows = append(rows, diff.Row())
		env.Progressf("clientscale: step p50 python %.3f ms, go %.3f ms (+%.3f ms)", pyP50, goP50, pyP50-goP50)
	}
	return rows, nil
}

func (c *clientScale) tier(ctx context.Context, env *suiteapi.Env, peers []*peerProc, n, windows int, mhz float64) ([]result.Row, error) {
	sessions := make([]*aci.Session, n)
	defer func() {
		for _, s := range sessions {
			if s != nil {
				s.Close()
			}
		}
	}()
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	var dialErr atomic.Value
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			s, err := aci.Dial(dctx, "ws://"+peers[i%len(peers)].addr+aci.DefaultUnixPath, "", aci.WithClientName("benchd-clientscale"))
			if err != nil {
				dialErr.Store(err)
				return
			}
			sessions[i] = s
		}(i)
	}
	wg.Wait()
	if err, ok := dialErr.Load().(error); ok {
		return nil, fmt.Errorf("dial: %w", err)
	}
	lbl := labels("sessions", itoa(n), "frame_bytes", itoa(c.frameBytes))
	lat := result.NewSeries("clientscale.observe_latency", "ms", lbl)
	lat.DropSamples = true
	fps := result.NewSeries("clientscale.frames_per_s", "frames/s", lbl)
	cpu := result.NewSeries("clientscale.client_cpu", "percent", lbl)
	perCore := result.NewSeries("clientscale.frames_per_client_core", "frames/s", lbl)
	perGHz := result.NewSeries("clientscale.frames_per_ghz_core", "frames/s/GHz-core", lbl)
	ingest := result.NewSeries("clientscale.ingest", "Mbps", lbl)
	rss := result.NewSeries("clientscale.client_rss", "MB", lbl)
	// One warm-up window of a second settles connections and buffers.
	if _, _, err := c.window1(ctx, sessions, time.Second, nil); err != nil {
		return nil, err
	}
	fps.Warmup()
	for w := 0; w < windows; w++ {
		meter, err := StartCPU("self")
		if err != nil {
			return nil, err
		}
		frames, failed, err := c.window1(ctx, sessions, c.window, lat)
		if err != nil {
			return nil, err
		}
		pct, wall, err := meter.Percent()
		if err != nil {
			return nil, err
		}
		for i := 0; i < failed; i++ {
			lat.Fail()
		}
		rate := float64(frames) / wall.Seconds()
		fps.Add(rate)
		cpu.Add(pct[0])
		if pct[0] > 0 {
			pc := rate / (pct[0] / 100)
			perCore.Add(pc)
			if mhz > 0 {
				perGHz.Add(pc / (mhz / 1000))
			}
		}
		ingest.Add(rate * float64(c.frameBytes) * 8 / 1e6)
		if kb, err := StatusKB("self", "VmRSS"); err == nil {
			rss.Add(float64(kb) / 1024)
		}
		env.Progressf("clientscale: N=%d window %d: %.0f frames/s, client CPU %.0f%%", n, w+1, rate, pct[0])
	}
	out := []result.Row{fps.Row(), lat.Row(), cpu.Row(), perCore.Row()}
	if perGHz.Len() > 0 {
		out = append(out, perGHz.Row())
	}
	return append(out, ingest.Row(), rss.Row()), nil
}

// window1 runs every session closed-loop (one screenshot in flight each) for
// d and returns frames completed and failed.
func (c *clientScale) window1(ctx context.Context, sessions []*aci.Session, d time.Duration, lat *result.Series) (int, int, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var frames, failed atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	req := &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: 80}
	for _, s := range sessions {
		wg.Add(1)
		go func(s *aci.Session) {
			defer wg.Done()
			local := make([]float64, 0, 256)
			for wctx.Err() == nil {
				t0 := time.Now()
				r, err := s.Screenshot(wctx, req)
				if wctx.Err() != nil {
					break // cut by the window end: neither success nor failure
				}
				if err != nil || len(r.GetData()) != c.frameBytes {
					failed.Add(1)
					continue
				}
				frames.Add(1)
				local = append(local, suiteapi.Ms(time.Since(t0)))
			}
			if lat != nil {
				mu.Lock()
				for _, v := range local {
					lat.Add(v)
				}
				mu.Unlock()
			}
		}(s)
	}
	wg.Wait()
	if ctx.Err() != nil {
		return 0, 0, ctx.Err()
	}
	return int(frames.Load()), int(failed.Load()), nil
}
