package suites

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/hostinfo"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suite"
)

// clientScale measures the client plane alone: N ACI sessions in this process
// against synthetic peers in separate processes.
type clientScale struct {
	sessions   intList
	frameBytes int
	peers      int
	window     time.Duration
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
}

func (c *clientScale) Check(ctx context.Context, env *suite.Env) error {
	if env.Self == "" {
		return suite.Skipf("benchd cannot find its own executable to start peers")
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

func (c *clientScale) Run(ctx context.Context, env *suite.Env) ([]result.Row, error) {
	if c.frameBytes <= 0 || c.peers <= 0 || c.window <= 0 {
		return nil, errors.New("clientscale: frame bytes, peers and window must be positive")
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
		env.Progressf("clientscale: N=%d sessions, %d windows of %s", n, windows, c.window)
		r, err := c.tier(ctx, env, peers, n, windows, mhz)
		if err != nil {
			return nil, fmt.Errorf("N=%d: %w", n, err)
		}
		rows = append(rows, r...)
	}
	env.Notef("goal: >= 5,000 frames/s of 90 KB per client core; peers run in %d separate processes on the same %d-core host, so they compete with the client for CPU", c.peers, hostCores())
	return rows, nil
}

func (c *clientScale) tier(ctx context.Context, env *suite.Env, peers []*peerProc, n, windows int, mhz float64) ([]result.Row, error) {
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
				local = append(local, suite.Ms(time.Since(t0)))
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
