//go:build linux

package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http/httptrace"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// poolSuite measures claims from warm pools under bursts larger than them:
// an image pool (booted, running desktops) and a checkpoint pool (replicas
// forked from a memory-tier checkpoint and kept frozen; a claim thaws one).
type poolSuite struct {
	size    int
	bursts  intList
	image   string
	kinds   string
	ksmWait time.Duration
	// idle: every member has waited at least this long in the pool when a
	// burst claims it, as in a pool between a trainer's rounds (a frozen
	// member's clocks run on: guestd used to collect its garbage at once
	// on a thaw two minutes after its last collection, gcpace).
	idle time.Duration
	// shotAfterHits: a hit's first screenshot waits until every hit of its
	// burst is usable. A screenshot is the claimant's first action, not
	// part of its claim: taken at once, the first claimant's capture and
	// PNG encoding (about 10 ms of CPU in its guestd) ran on the 2 vCPUs
	// while the burst's other claims still made their sessions, and their
	// "usable" measured that.
	shotAfterHits bool
	// burstCPU: read every host task's CPU time before each burst and when
	// its last hit is usable, for where the burst's CPU went (taskGroup).
	burstCPU bool
	// gcBeforeBurst: benchd collects its own garbage before each burst, so
	// its collector (a fifth of benchd's CPU in a burst's window when it
	// fell there: the client's heap is small, so it collects often) does
	// not run on the 2 vCPUs beside the claims it measures.
	gcBeforeBurst bool
	// pingWithHello: a claimant's first ping rides behind its session's
	// Hello (aci.WithPing): one round trip with the claimed guestd from
	// the dial to the ping's answer instead of two. The ping proves the
	// same (guestd executes the session's requests); the client is not
	// woken between the Hello's reply and the ping's send.
	pingWithHello bool
}

// poolKindLabel keys the pool's sandboxes, so its idle replicas can be
// listed apart from everything else benchd runs.
const poolKindLabel = "forkfleet.dev/benchd-pool"

func (*poolSuite) Name() string { return "pool" }
func (*poolSuite) Description() string {
	return "image and frozen-checkpoint pools: claim RPC and claim to first ACI answer (hit vs miss), hit rate under bursts up to 2x the pool, PSS per idle pooled replica"
}
func (p *poolSuite) Flags(fs *flag.FlagSet) {
	p.bursts = intList{2, 4, 8}
	fs.IntVar(&p.size, "pool-size", 4, "warm pool size")
	fs.Var(&p.bursts, "pool-bursts", "concurrent claims per burst")
	fs.StringVar(&p.image, "pool-image", "", "image of the pools and of the checkpoint pool's source (empty: the image controld boots by default)")
	fs.StringVar(&p.kinds, "pool-kinds", "image,checkpoint", "pools to measure: image (booted desktops), checkpoint (frozen replicas of a memory-tier checkpoint)")
	fs.DurationVar(&p.idle, "pool-idle", 0, "before each burst, wait this long once the pool is full, so every member claimed has been idle that long (cells labelled idle_s; use with small --n: each burst waits)")
	fs.DurationVar(&p.ksmWait, "pool-ksm-wait", 20*time.Second, "read idle replica memory again this long after the pool filled (KSM merges over time; 0 disables)")
	fs.BoolVar(&p.shotAfterHits, "pool-shot-after-hits", true, "a hit's first screenshot waits until every hit of its burst is usable (false: at once, as runs before 2026-12-02 11:20)")
	fs.BoolVar(&p.gcBeforeBurst, "pool-gc-before-burst", true, "benchd collects its own garbage before each burst, so its collector does not run beside the claims it measures (false: as runs before 2026-12-02 14:00)")
	fs.BoolVar(&p.pingWithHello, "pool-ping-with-hello", true, "a claimant's first ping rides behind its session's Hello (aci.WithPing), so the dial returns with its answer (false: the ping is sent once the dial returned, as runs before 2026-12-02 18:00; the ping phase is then reported apart)")
	fs.BoolVar(&p.burstCPU, "pool-burst-cpu", true, "report the CPU time each group of host tasks (client, controld, guestd, desktop, runtime, kernel...) ran in each burst's window, read from /proc before the burst and once its last hit is usable")
}
func (p *poolSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	return checkControld(ctx, env)
}

// claimTimes are the milestones of one claim, from the client's side.
type claimTimes struct {
	rpc, usable, screenshot time.Duration
	// capture and encode are guestd's parts of the first screenshot.
	capture, encode time.Duration
	// session is the client's own part of usable: its session's dial
	// (connect, WebSocket upgrade, Hello) and first ping.
	session time.Duration
	// The session's phases: connect (to guestd's socket, or the gateway's
	// port), the upgrade's round trip (request written to 101 read), the
	// Hello round trip, the first ping. Zero when the dial did not say
	// (httptrace).
	connect, upgrade, hello, ping time.Duration
}

// sessionTrace times a session dial's phases through net/http's client
// trace, which the WebSocket upgrade goes through.
type sessionTrace struct {
	gotConn, firstByte time.Time
}

func (t *sessionTrace) with(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:              func(httptrace.GotConnInfo) { t.gotConn = time.Now() },
		GotFirstResponseByte: func() { t.firstByte = time.Now() },
	})
}

// usableAfter completes a claim or create at t0: the sandbox's endpoint
// answers a first ACI request (ping), then a first screenshot.
func usableAfter(ctx context.Context, t0 time.Time, ep *controldv1.Endpoint, ct *claimTimes) error {
	return usableThen(ctx, t0, ep, ct, false, nil)
}

// usableThen is usableAfter with usable called between the ping and the
// screenshot (when not nil). pipelined: the ping rides behind the
// session's Hello (aci.WithPing), so the dial returns with its answer and
// the hello phase holds both replies (ct.ping stays 0).
func usableThen(ctx context.Context, t0 time.Time, ep *controldv1.Endpoint, ct *claimTimes, pipelined bool, usable func()) error {
	t1 := time.Now()
	var tr sessionTrace
	var opts []aci.DialOption
	if pipelined {
		opts = append(opts, aci.WithPing([]byte("benchd")))
	}
	s, err := dialEndpoint(tr.with(ctx), ep, opts...)
	if err != nil {
		return err
	}
	defer s.Close()
	t2 := time.Now()
	if !pipelined {
		if _, err := s.Ping(ctx, []byte("benchd")); err != nil {
			return err
		}
	}
	ct.usable = time.Since(t0)
	ct.session = time.Since(t1)
	if !tr.gotConn.IsZero() && !tr.firstByte.IsZero() {
		ct.connect, ct.upgrade, ct.hello = tr.gotConn.Sub(t1), tr.firstByte.Sub(tr.gotConn), t2.Sub(tr.firstByte)
	}
	if !pipelined {
		ct.ping = time.Since(t2)
	}
	if usable != nil {
		usable()
	}
	r, err := s.Screenshot(ctx, aci.PNG())
	if err != nil {
		return err
	}
	if !validImage("png", r) {
		return suiteapi.ErrUnverified
	}
	ct.screenshot = time.Since(t0)
	ct.capture, ct.encode = time.Duration(r.GetCaptureNs()), time.Duration(r.GetEncodeNs())
	return nil
}

// claimSeries are one cell's series: served hit or miss. The breakdown of
// usable: rpc (of which server is controld's own part, and transport the
// rest: gRPC both ways, the request's interceptors, the client) and
// session (connect, upgrade, hello, ping).
type claimSeries struct {
	rpc, server, transport, session, usable, screenshot *result.Series
	connect, upgrade, hello, ping                       *result.Series
	capture, encode                                     *result.Series
}

func newClaimSeries(lbl map[string]string) *claimSeries {
	return &claimSeries{
		rpc:        result.NewSeries("pool.claim_rpc", "ms", lbl),
		server:     result.NewSeries("pool.claim_server", "ms", lbl),
		transport:  result.NewSeries("pool.claim_transport", "ms", lbl),
		session:    result.NewSeries("pool.claim_session", "ms", lbl),
		connect:    result.NewSeries("pool.claim_session_connect", "ms", lbl),
		upgrade:    result.NewSeries("pool.claim_session_upgrade", "ms", lbl),
		hello:      result.NewSeries("pool.claim_session_hello", "ms", lbl),
		ping:       result.NewSeries("pool.claim_session_ping", "ms", lbl),
		usable:     result.NewSeries("pool.claim_usable", "ms", lbl),
		screenshot: result.NewSeries("pool.claim_first_screenshot", "ms", lbl),
		capture:    result.NewSeries("pool.claim_first_capture", "ms", lbl),
		encode:     result.NewSeries("pool.claim_first_encode", "ms", lbl),
	}
}

func (cs *claimSeries) record(ct claimTimes, server time.Duration, rpcOK bool, err error) {
	switch {
	case !rpcOK:
		for _, s := range cs.all() {
			s.Fail()
		}
		return
	case err == nil:
		cs.session.Add(suiteapi.Ms(ct.session))
		if ct.upgrade > 0 {
			cs.connect.Add(suiteapi.Ms(ct.connect))
			cs.upgrade.Add(suiteapi.Ms(ct.upgrade))
			cs.hello.Add(suiteapi.Ms(ct.hello))
		}
		if ct.ping > 0 {
			cs.ping.Add(suiteapi.Ms(ct.ping))
		}
		cs.usable.Add(suiteapi.Ms(ct.usable))
		cs.screenshot.Add(suiteapi.Ms(ct.screenshot))
		cs.capture.Add(suiteapi.Ms(ct.capture))
		cs.encode.Add(suiteapi.Ms(ct.encode))
	case errors.Is(err, suiteapi.ErrUnverified):
		cs.usable.Add(suiteapi.Ms(ct.usable))
		cs.screenshot.Unverified()
		cs.capture.Unverified()
		cs.encode.Unverified()
	case ct.usable > 0:
		cs.usable.Add(suiteapi.Ms(ct.usable))
		cs.screenshot.Fail()
		cs.capture.Fail()
		cs.encode.Fail()
	default:
		cs.usable.Fail()
		cs.screenshot.Fail()
		cs.capture.Fail()
		cs.encode.Fail()
	}
	if ct.usable > 0 {
		// The RPC counts once the sandbox it returned proved usable.
		cs.rpc.Add(suiteapi.Ms(ct.rpc))
		cs.server.Add(suiteapi.Ms(server))
		cs.transport.Add(suiteapi.Ms(ct.rpc - server))
	} else {
		cs.rpc.Unverified()
		cs.server.Unverified()
		cs.transport.Unverified()
	}
}

func (cs *claimSeries) all() []*result.Series {
	return []*result.Series{cs.rpc, cs.server, cs.transport, cs.session, cs.connect, cs.upgrade, cs.hello, cs.ping, cs.usable, cs.screenshot, cs.capture, cs.encode}
}

func (p *poolSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	reps := env.Samples(3)
	// The path a claim saves: a cold create to usable, in the same run. It
	// also names the image the pool is built from (controld's default).
	cold := newClaimSeries(labels("served", "cold-create-no-pool"))
	image := p.image
	for i := 0; i < reps; i++ {
		t0 := time.Now()
		resp, err := c.createImage(ctx, p.image)
		ct := claimTimes{rpc: time.Since(t0)}
		if err == nil {
			err = usableThen(ctx, t0, resp.GetEndpoint(), &ct, p.pingWithHello, nil)
			if image == "" {
				image = resp.GetSandbox().GetImage()
			}
			c.remove(ctx, resp.GetSandbox().GetId())
		}
		cold.record(ct, ct.rpc, resp != nil, err)
	}
	if image == "" {
		return nil, errors.New("no cold boot succeeded, so the pool image is unknown (pass --pool-image)")
	}
	rows := []result.Row{cold.usable.Row(), cold.screenshot.Row()}
	measured := 0
	for _, kind := range strings.Split(p.kinds, ",") {
		var src controldv1.CreatePoolRequest
		switch strings.TrimSpace(kind) {
		case "image":
			src.Source = &controldv1.CreatePoolRequest_Image{Image: image}
		case "checkpoint":
			gsrc, ck, err := stillGolden(ctx, c, image)
			c.remove(ctx, gsrc)
			if err != nil {
				env.Notef("checkpoint pool not measured: %v", err)
				continue
			}
			defer c.removeCheckpoint(ctx, ck.GetId())
			src.Source = &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.GetId()}
		case "":
			continue
		default:
			return nil, fmt.Errorf("--pool-kinds: unknown pool kind %q (image, checkpoint)", kind)
		}
		r, err := p.measure(ctx, env, c, strings.TrimSpace(kind), &src, reps)
		if err != nil {
			env.Notef("%s pool: %v", kind, err)
			continue
		}
		rows = append(rows, r...)
		measured++
	}
	if measured == 0 {
		return nil, errors.New("no pool could be measured")
	}
	return rows, nil
}

// measure creates one pool from req's source, reads its idle replicas'
// memory, then claims in bursts; the pool is deleted afterwards.
func (p *poolSuite) measure(ctx context.Context, env *suiteapi.Env, c *controld, kind string, req *controldv1.CreatePoolRequest, reps int) ([]result.Row, error) {
	name := fmt.Sprintf("benchd-%s-%d", kind, time.Now().UnixNano())
	req.Name, req.Size = name, uint32(p.size)
	req.Labels = map[string]string{benchLabel: "1", poolKindLabel: name}
	pr, err := c.pl.CreatePool(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	poolID := pr.GetPool().GetId()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
		defer cancel()
		if _, err := c.pl.DeletePool(dctx, &controldv1.DeletePoolRequest{Id: poolID}); err != nil {
			env.Progressf("delete pool %s: %v", poolID, err)
		}
	}()
	idle := controldv1.SandboxState_SANDBOX_STATE_READY
	if pr.GetPool().GetFrozen() {
		idle = controldv1.SandboxState_SANDBOX_STATE_SUSPENDED
	}
	waitFull := func() error {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			g, err := c.pl.GetPool(ctx, &controldv1.GetPoolRequest{Id: poolID})
			if err != nil {
				return err
			}
			if g.GetPool().GetAvailable() >= uint32(p.size) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pool refilled to %d of %d in 3 minutes", g.GetPool().GetAvailable(), p.size)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t0 := time.Now()
	if err := waitFull(); err != nil {
		return nil, err
	}
	poolLbl := func(kv ...string) map[string]string {
		kv = append([]string{"pool", kind, "pool_size", itoa(p.size)}, kv...)
		if p.idle > 0 {
			kv = append(kv, "idle_s", itoa(int(p.idle.Round(time.Second).Seconds())))
		}
		return labels(kv...)
	}
	fill := result.Single("pool.fill", "ms", poolLbl(), suiteapi.Ms(time.Since(t0)))
	rows := []result.Row{fill}
	if kind == "image" {
		// Its misses fork from the pool's own checkpoint, made once the
		// pool is full: measure them with it (a controld without it boots
		// them).
		if ck, err := waitPoolCheckpoint(ctx, c, poolID, 2*time.Minute); err != nil {
			env.Notef("image pool: no checkpoint of its own (%v): its misses boot", err)
		} else {
			rows = append(rows, result.Single("pool.checkpoint_ready", "ms", poolLbl(), suiteapi.Ms(time.Since(t0))))
			env.Progressf("image pool: its checkpoint %s is ready", ck)
		}
	}
	missForks, misses := 0, 0
	// Memory of the idle replicas: right after warm-up, and for the frozen
	// pool again once KSM had time to merge their identical pages.
	waits := []time.Duration{0}
	if idle == controldv1.SandboxState_SANDBOX_STATE_SUSPENDED && p.ksmWait > 0 {
		waits = append(waits, p.ksmWait)
	}
	filled, ksm0 := time.Now(), readKSM(ksmDir)
	for _, w := range waits {
		sleepCtx(ctx, w-time.Since(filled))
		after := strconv.Itoa(int(time.Since(filled).Round(time.Second).Seconds()))
		mem := newReplicaMem("pool.idle_replica", "", poolLbl("after_s", after), w > 0)
		ls, err := c.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{Labels: map[string]string{poolKindLabel: name},
			States: []controldv1.SandboxState{idle}})
		if err != nil {
			return nil, fmt.Errorf("list pool replicas: %w", err)
		}
		var ids []string
		for _, sb := range ls.GetSandboxes() {
			if sb.GetPoolId() == poolID {
				ids = append(ids, sb.GetId())
			}
		}
		if missing := mem.add(ids); missing > 0 || len(ids) == 0 {
			env.Notef("%s pool: processes of %d of %d idle replicas not found: PSS/RSS rows cover only those found", kind, missing, len(ids))
		}
		if mr := mem.rows(); len(mr) > 0 {
			rows = append(rows, mr...)
			env.Progressf("%s pool: idle replica PSS p50 %.1f MB after %s s", kind, *mr[0].P50, after)
		}
		if w > 0 {
			ksm := readKSM(ksmDir)
			rows = append(rows, result.Single("pool.ksm_full_scans", "scans", poolLbl("after_s", after), ksm.fullScansSince(ksm0)))
			env.Notef("%s pool, %s s after the fill: %.0f full KSM scans since; %s", kind, after, ksm.fullScansSince(ksm0), ksm.summary())
		}
	}
	for _, b := range p.bursts {
		hit := newClaimSeries(poolLbl("burst", itoa(b), "served", "hit"))
		miss := newClaimSeries(poolLbl("burst", itoa(b), "served", "miss"))
		rate := result.NewSeries("pool.hit_rate", "percent", poolLbl("burst", itoa(b)))
		rate.Better = result.BetterHigher
		// Where a burst's time goes on the host: the window from its start
		// to its last hit usable, and the share of that window in which
		// some task was runnable but waited for a CPU (the kernel's CPU
		// pressure, /proc/pressure/cpu "some").
		wall := result.NewSeries("pool.burst_hits_wall", "ms", poolLbl("burst", itoa(b)))
		stall := result.NewSeries("pool.burst_cpu_wait", "percent", poolLbl("burst", itoa(b)))
		// What ran in that window, by group of tasks (taskGroup), and all
		// of it: the window has 2 x wall of CPU on 2 vCPUs.
		cpu := map[string]*result.Series{}
		for _, g := range append([]string{"all"}, burstCPUGroups...) {
			cpu[g] = result.NewSeries("pool.burst_cpu", "ms", poolLbl("burst", itoa(b), "proc", g))
		}
		for r := 0; r < reps; r++ {
			if err := waitFull(); err != nil {
				return nil, err
			}
			sleepCtx(ctx, p.idle)
			var mu sync.Mutex
			var ids []string
			hits := 0
			var wg sync.WaitGroup
			hitsUsable, allUsable := 0, make(chan struct{})
			if p.gcBeforeBurst {
				runtime.GC()
			}
			var tasks *taskMeter
			if p.burstCPU {
				tasks = newTaskMeter()
			}
			psi0, psiErr := cpuStallTotal()
			mono0 := monotonicNow()
			start := time.Now()
			onUsable := func() {
				mu.Lock()
				defer mu.Unlock()
				if hitsUsable++; hitsUsable != min(b, p.size) {
					return
				}
				w := time.Since(start)
				if psi1, err := cpuStallTotal(); err == nil && psiErr == nil {
					wall.Add(suiteapi.Ms(w))
					stall.Add(float64(psi1-psi0) / float64(w.Microseconds()) * 100)
				}
				if tasks != nil {
					mono1 := monotonicNow()
					ran := tasks.since()
					// The window on CLOCK_MONOTONIC, for a host profile of
					// the run (perf record -k CLOCK_MONOTONIC).
					env.Progressf("%s pool: burst %d rep %d: hits window %d-%d (CLOCK_MONOTONIC ns)", kind, b, r+1, mono0, mono1)
					var all time.Duration
					for _, g := range burstCPUGroups {
						cpu[g].Add(suiteapi.Ms(ran[g]))
						all += ran[g]
					}
					cpu["all"].Add(suiteapi.Ms(all))
				}
				close(allUsable)
			}
			for i := 0; i < b; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					t0 := time.Now()
					cr, err := c.pl.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: poolID, Labels: map[string]string{benchLabel: "1"},
						Ttl: durationpb.New(benchTTL)})
					ct := claimTimes{rpc: time.Since(t0)}
					if err == nil {
						var usable func()
						if cr.GetHit() {
							usable = func() {
								onUsable()
								if p.shotAfterHits {
									select {
									case <-allUsable:
									case <-ctx.Done():
									case <-time.After(5 * time.Second):
									}
								}
							}
						}
						err = usableThen(ctx, t0, cr.GetEndpoint(), &ct, p.pingWithHello, usable)
					} else {
						env.Progressf("%s pool claim: %v", kind, err)
					}
					mu.Lock()
					defer mu.Unlock()
					s := miss
					if cr != nil {
						ids = append(ids, cr.GetSandbox().GetId())
						if cr.GetHit() {
							s = hit
							hits++
						} else {
							misses++
							if cr.GetSandbox().GetCheckpointId() != "" {
								missForks++
							}
						}
					}
					s.record(ct, cr.GetTook().AsDuration(), cr != nil, err)
				}()
			}
			wg.Wait()
			if tasks != nil {
				tasks.Close()
			}
			rate.Add(float64(hits) / float64(b) * 100)
			for _, id := range ids {
				c.remove(ctx, id)
			}
			env.Progressf("%s pool: burst %d rep %d: %d hits", kind, b, r+1, hits)
		}
		for _, cs := range []*claimSeries{hit, miss} {
			for _, s := range cs.all() {
				if row := s.Row(); row.N > 0 || row.Failed > 0 || row.Unverified > 0 {
					rows = append(rows, row)
				}
			}
		}
		rows = append(rows, rate.Row())
		for _, s := range []*result.Series{wall, stall, cpu["all"]} {
			if row := s.Row(); row.N > 0 {
				rows = append(rows, row)
			}
		}
		for _, g := range burstCPUGroups {
			if row := cpu[g].Row(); row.N > 0 && row.P50 != nil && row.Max != nil && *row.Max > 0 {
				rows = append(rows, row)
			}
		}
	}
	if misses > 0 {
		env.Notef("%s pool: %d of %d misses were forks (the others booted)", kind, missForks, misses)
	}
	return rows, nil
}

// burstCPUGroups are the groups of host tasks a burst's CPU is split by
// (taskGroup).
var burstCPUGroups = []string{"client", "controld", "guestd", "desktop", "runtime", "ksmd", "kworker", "kernel", "other"}

// cpuStallTotal is the host's CPU pressure: the microseconds in which some
// runnable task waited for a CPU (/proc/pressure/cpu, "some ... total=").
func cpuStallTotal() (uint64, error) {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "some ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				return strconv.ParseUint(v, 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("/proc/pressure/cpu: no some total")
}

// stillGolden boots the checkpoint pool's source (image, controld's default
// when empty), waits until its screen has been still for 500 ms and
// checkpoints it (memory tier); the caller deletes both. A desktop is
// usable once its windows are mapped, while its shell may still draw:
// checkpointed then, every replica finishes that paint once its apps
// resume, in the claims' window (pools.md: the image pool's own checkpoint
// waits the same way).
func stillGolden(ctx context.Context, c *controld, image string) (sandboxID string, ck *controldv1.Checkpoint, err error) {
	resp, err := c.createImage(ctx, image)
	if err != nil {
		return "", nil, fmt.Errorf("create golden sandbox: %w", err)
	}
	id := resp.GetSandbox().GetId()
	if err := waitScreenStill(ctx, resp.GetEndpoint()); err != nil {
		return id, nil, fmt.Errorf("golden sandbox: %w", err)
	}
	r, err := c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: id, Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY,
		Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return id, nil, fmt.Errorf("checkpoint golden: %w", err)
	}
	return id, r.GetCheckpoint(), nil
}

// waitScreenStill returns once the sandbox's screen has not changed for
// 500 ms (guestd's settled screenshot), within 10 s.
func waitScreenStill(ctx context.Context, ep *controldv1.Endpoint) error {
	s, err := dialEndpoint(ctx, ep)
	if err != nil {
		return err
	}
	defer s.Close()
	req := aci.PNG()
	req.Format = aciv1.ImageFormat_IMAGE_FORMAT_NONE
	req.SettleMs, req.SettleTimeoutMs = 500, 10000
	if _, err := s.Screenshot(ctx, req); err != nil {
		return fmt.Errorf("settled screenshot: %w", err)
	}
	return nil
}

// waitPoolCheckpoint waits until image pool poolID has its own checkpoint
// (labelled with the pool's id) and returns its id.
func waitPoolCheckpoint(ctx context.Context, c *controld, poolID string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for {
		l, err := c.ck.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{Labels: map[string]string{rules.PoolIDLabel: poolID}})
		if err != nil {
			return "", err
		}
		if cks := l.GetCheckpoints(); len(cks) > 0 {
			return cks[0].GetId(), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("none after %s", within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
