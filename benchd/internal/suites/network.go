//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/netnsfile"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// networkSuite measures what network mode egress costs against mode none,
// interleaved in one run on the same controld: boot to usable (warm
// slots), fork to verified usable (N=1 and N=8, fork slots), pool claim to
// usable, and the egress path's throughput against the same transfer made
// from the host. The transfers go to a server in a network namespace the
// suite creates and attaches to the host like a machine on its network
// (198.18.200.0/30, a benchmarking range): no other address is contacted.
type networkSuite struct {
	reps     int
	forkReps int
	mb       int
}

func (*networkSuite) Name() string { return "network" }
func (*networkSuite) Description() string {
	return "mode egress vs none, same run: boot, fork N=1/N=8, pool claim to usable; egress throughput vs the host's"
}
func (s *networkSuite) Flags(fs *flag.FlagSet) {
	fs.IntVar(&s.reps, "network-reps", 10, "boot and claim repetitions per mode (--n overrides)")
	fs.IntVar(&s.forkReps, "network-fork-reps", 4, "fork repetitions per mode and N")
	fs.IntVar(&s.mb, "network-mb", 256, "MiB per throughput transfer")
}

func (s *networkSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	if os.Geteuid() != 0 {
		return suiteapi.Skipf("needs root (a network namespace for the outside server)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return suiteapi.Skipf("no ip (iproute2)")
	}
	return checkControld(ctx, env)
}

var networkModes = []controldv1.NetworkMode{controldv1.NetworkMode_NETWORK_MODE_NONE, controldv1.NetworkMode_NETWORK_MODE_EGRESS}

func modeName(m controldv1.NetworkMode) string {
	return strings.ToLower(strings.TrimPrefix(m.String(), "NETWORK_MODE_"))
}

// modesInTurn alternates which mode goes first, so neither always runs
// right after the other's cleanup.
func modesInTurn(r int) []controldv1.NetworkMode {
	if r%2 == 0 {
		return networkModes
	}
	return []controldv1.NetworkMode{networkModes[1], networkModes[0]}
}

func (s *networkSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// Egress available here at all?
	probe, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Network: &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS},
		Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
	if err != nil {
		if errors.Is(errgrpc.FromGRPC(err), errdefs.ErrFailedPrecondition) {
			return nil, suiteapi.Skipf("controld offers no mode egress: %v", err)
		}
		return nil, err
	}
	c.remove(ctx, probe.GetSandbox().GetId())
	var rows []result.Row
	reps := env.Samples(s.reps)
	rows = append(rows, s.boot(ctx, env, c, reps)...)
	fr, err := s.fork(ctx, env, c)
	if err != nil {
		return nil, err
	}
	rows = append(rows, fr...)
	tr, err := s.throughput(ctx, env, c)
	if err != nil {
		env.Notef("throughput not measured: %v", err)
	} else {
		rows = append(rows, tr...)
	}
	return append(rows, overheadRows(rows)...), nil
}

func (s *networkSuite) create(ctx context.Context, c *controld, m controldv1.NetworkMode) (*controldv1.CreateSandboxResponse, error) {
	return c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Network: &controldv1.Network{Mode: m},
		Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
}

// boot: CreateSandbox with wait_ready, one at a time, after a pause long
// enough for the warm slot to be refilled (the first create of each mode is
// a warm-up: it tells controld egress slots are wanted).
func (s *networkSuite) boot(ctx context.Context, env *suiteapi.Env, c *controld, reps int) []result.Row {
	series := map[controldv1.NetworkMode]*result.Series{}
	for _, m := range networkModes {
		series[m] = result.NewSeries("network.boot_usable", "ms", labels("mode", modeName(m)))
	}
	for r := -1; r < reps; r++ {
		for _, m := range modesInTurn(r) {
			sleepCtx(ctx, time.Second) // slot refill (150 ms quiet after the last boot, then a precreate)
			t0 := time.Now()
			resp, err := s.create(ctx, c, m)
			d := time.Since(t0)
			if err != nil {
				series[m].Fail()
				env.Progressf("boot %s: %v", modeName(m), err)
				continue
			}
			if r >= 0 {
				series[m].Add(suiteapi.Ms(d))
			} else {
				series[m].Warmup()
			}
			c.remove(ctx, resp.GetSandbox().GetId())
		}
	}
	return []result.Row{series[networkModes[0]].Row(), series[networkModes[1]].Row()}
}

// fork: ForkCheckpoint of a checkpoint of each mode, N=1 and N=8, client
// wall to every replica verified at the default levels; then a pool claim
// (frozen pool of 2 per mode) to its first ACI answer.
func (s *networkSuite) fork(ctx context.Context, env *suiteapi.Env, c *controld) ([]result.Row, error) {
	cks := map[controldv1.NetworkMode]string{}
	pools := map[controldv1.NetworkMode]string{}
	defer func() {
		for _, p := range pools {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			c.pl.DeletePool(dctx, &controldv1.DeletePoolRequest{Id: p})
			cancel()
		}
		for _, ck := range cks {
			c.removeCheckpoint(ctx, ck)
		}
	}()
	for _, m := range networkModes {
		src, err := s.create(ctx, c, m)
		if err != nil {
			return nil, fmt.Errorf("golden %s: %w", modeName(m), err)
		}
		ck, err := c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.GetSandbox().GetId(), Labels: map[string]string{benchLabel: "1"}})
		c.remove(ctx, src.GetSandbox().GetId())
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", modeName(m), err)
		}
		cks[m] = ck.GetCheckpoint().GetId()
	}
	var rows []result.Row
	for _, n := range []int{1, 8} {
		series := map[controldv1.NetworkMode]*result.Series{}
		for _, m := range networkModes {
			series[m] = result.NewSeries("network.fork_usable", "ms", labels("mode", modeName(m), "n", itoa(n)))
		}
		for r := -1; r < s.forkReps; r++ {
			for _, m := range modesInTurn(r) {
				sleepCtx(ctx, 1500*time.Millisecond) // fork slot refill
				t0 := time.Now()
				resp, err := c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: cks[m], Count: uint32(n),
					Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
				d := time.Since(t0)
				good := 0
				for _, rep := range resp.GetReplicas() {
					if verified(rep) {
						good++
					}
					c.remove(ctx, rep.GetSandbox().GetId())
				}
				switch {
				case err != nil || good != n:
					series[m].Fail()
					env.Progressf("fork %s N=%d: %d/%d verified (%v)", modeName(m), n, good, n, err)
				case r < 0:
					series[m].Warmup()
				default:
					series[m].Add(suiteapi.Ms(d))
				}
			}
		}
		rows = append(rows, series[networkModes[0]].Row(), series[networkModes[1]].Row())
	}

	claim := map[controldv1.NetworkMode]*result.Series{}
	for _, m := range networkModes {
		claim[m] = result.NewSeries("network.pool_claim_usable", "ms", labels("mode", modeName(m)))
		p, err := c.pl.CreatePool(ctx, &controldv1.CreatePoolRequest{Name: fmt.Sprintf("benchd-net-%s-%d", modeName(m), time.Now().UnixNano()),
			Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: cks[m]}, Size: 2, Labels: map[string]string{benchLabel: "1"}})
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", modeName(m), err)
		}
		pools[m] = p.GetPool().GetId()
	}
	waitFull := func(id string) error {
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			g, err := c.pl.GetPool(ctx, &controldv1.GetPoolRequest{Id: id})
			if err != nil {
				return err
			}
			if g.GetPool().GetAvailable() >= 2 {
				return nil
			}
		}
		return fmt.Errorf("pool %s not refilled in 3 minutes", id)
	}
	for r := 0; r < env.Samples(s.reps); r++ {
		for _, m := range modesInTurn(r) {
			if err := waitFull(pools[m]); err != nil {
				return nil, err
			}
			sleepCtx(ctx, 300*time.Millisecond)
			t0 := time.Now()
			cr, err := c.pl.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: pools[m], Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
			if err == nil {
				var ct claimTimes
				err = usableAfter(ctx, t0, cr.GetEndpoint(), &ct)
				if err == nil && cr.GetHit() {
					claim[m].Add(suiteapi.Ms(ct.usable))
				}
			}
			if err != nil {
				claim[m].Fail()
				env.Progressf("claim %s: %v", modeName(m), err)
			}
			c.remove(ctx, cr.GetSandbox().GetId())
		}
	}
	return append(rows, claim[networkModes[0]].Row(), claim[networkModes[1]].Row()), nil
}

// throughput: the same transfer (bash reading /dev/tcp into /dev/null) from
// an egress sandbox and from the host, to the outside server, interleaved.
func (s *networkSuite) throughput(ctx context.Context, env *suiteapi.Env, c *controld) ([]result.Row, error) {
	out, err := newOutsideHost()
	if err != nil {
		return nil, err
	}
	defer out.close()
	sb, err := s.create(ctx, c, controldv1.NetworkMode_NETWORK_MODE_EGRESS)
	if err != nil {
		return nil, err
	}
	defer c.remove(ctx, sb.GetSandbox().GetId())
	sess, err := dialEndpoint(ctx, sb.GetEndpoint())
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	n := int64(s.mb) << 20
	script := fmt.Sprintf(`exec 3<>/dev/tcp/%s/80 && printf 'GET /bytes?n=%d HTTP/1.0\r\n\r\n' >&3 && cat <&3 >/dev/null`, outsideAddr, n)
	lbl := func(path string) map[string]string { return labels("path", path, "mib", itoa(s.mb)) }
	inSandbox := result.NewSeries("network.egress_throughput", "MB/s", lbl("sandbox"))
	onHost := result.NewSeries("network.egress_throughput", "MB/s", lbl("host"))
	inSandbox.Better, onHost.Better = result.BetterHigher, result.BetterHigher
	mbps := func(d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }
	for r := -1; r < 5; r++ {
		t0 := time.Now()
		resp, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"/usr/bin/bash", "-c", script}, TimeoutMs: 60000})
		d := time.Since(t0)
		switch {
		case err != nil || resp.GetExitCode() != 0:
			inSandbox.Fail()
			env.Progressf("egress transfer: %v %s", err, resp.GetStderr())
		case r >= 0:
			inSandbox.Add(mbps(d))
		}
		t0 = time.Now()
		err = exec.CommandContext(ctx, "bash", "-c", script).Run()
		d = time.Since(t0)
		switch {
		case err != nil:
			onHost.Fail()
			env.Progressf("host transfer: %v", err)
		case r >= 0:
			onHost.Add(mbps(d))
		}
	}
	rows := []result.Row{inSandbox.Row(), onHost.Row()}
	if a, b := inSandbox.Values(), onHost.Values(); len(a) > 0 && len(b) > 0 {
		rows = append(rows, result.Single("network.egress_throughput_ratio", "ratio", labels("of", "sandbox/host"), median(a)/median(b)))
	}
	return rows, nil
}

// overheadRows: egress p50 minus none p50, per measured metric and N.
func overheadRows(rows []result.Row) []result.Row {
	p50 := map[string]map[string]float64{}
	for _, r := range rows {
		mode := r.Labels["mode"]
		if mode == "" || r.P50 == nil {
			continue
		}
		key := r.Metric + "|" + r.Labels["n"]
		if p50[key] == nil {
			p50[key] = map[string]float64{}
		}
		p50[key][mode] = *r.P50
	}
	keys := make([]string, 0, len(p50))
	for k := range p50 {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []result.Row
	for _, k := range keys {
		m := p50[k]
		e, okE := m["egress"]
		none, okN := m["none"]
		if !okE || !okN {
			continue
		}
		metric, n, _ := strings.Cut(k, "|")
		lbl := labels("of", metric)
		if n != "" {
			lbl["n"] = n
		}
		out = append(out, result.Single("network.egress_overhead_p50", "ms", lbl, e-none))
	}
	return out
}

// The outside host: a namespace the suite makes, linked to the host.
const (
	outsideNS   = "benchd-outside"
	outsideLink = "bdout0"
	outsideAddr = "198.18.200.2"
	outsideHost = "198.18.200.1"
)

type outsideServer struct {
	srv *http.Server
}

func newOutsideHost() (*outsideServer, error) {
	exec.Command("ip", "netns", "del", outsideNS).Run() // a crashed run's
	exec.Command("ip", "link", "del", outsideLink).Run()
	for _, args := range [][]string{
		{"netns", "add", outsideNS},
		{"link", "add", outsideLink, "type", "veth", "peer", "name", "eth0", "netns", outsideNS},
		{"addr", "add", outsideHost + "/30", "dev", outsideLink},
		{"link", "set", outsideLink, "up"},
		{"-n", outsideNS, "addr", "add", outsideAddr + "/30", "dev", "eth0"},
		{"-n", outsideNS, "link", "set", "eth0", "up"},
		{"-n", outsideNS, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			exec.Command("ip", "netns", "del", outsideNS).Run()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	var ln net.Listener
	err := netnsfile.Run("/run/netns/"+outsideNS, func() (err error) {
		ln, err = net.Listen("tcp4", outsideAddr+":80")
		return err
	})
	if err != nil {
		exec.Command("ip", "netns", "del", outsideNS).Run()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		var n int64
		fmt.Sscan(r.URL.Query().Get("n"), &n)
		w.Header().Set("Content-Length", fmt.Sprint(n))
		io.CopyN(w, zeros{}, n)
	})
	o := &outsideServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go o.srv.Serve(ln)
	return o, nil
}

func (o *outsideServer) close() {
	o.srv.Close()
	exec.Command("ip", "netns", "del", outsideNS).Run()
	exec.Command("ip", "link", "del", outsideLink).Run()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
