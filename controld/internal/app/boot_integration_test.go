package app_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/forkfleet/forkfleet/api/aci"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/containerdrt"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// bootStack is controld on the real containerd in its own namespace
// (forkfleet-boot-it, see testenv), holding the desktop image.
type bootStack struct {
	t     *testing.T
	ctx   context.Context
	cfg   *config.Config
	rt    *containerdrt.Runtime
	image string
	log   *slog.Logger

	// Set by launch, cleared by stop.
	addrs app.Addrs
	conn  *grpc.ClientConn
	sbc   controldv1.SandboxServiceClient
	ckc   controldv1.CheckpointServiceClient
	plc   controldv1.PoolServiceClient
	stopC func()
}

func newBootStack(t *testing.T) *bootStack { return newStackIn(t, "forkfleet-boot-it") }

// newStackIn is a bootStack on the namespace testenv.Namespace(base).
func newStackIn(t *testing.T, base string, opts ...func(*config.Config)) *bootStack {
	t.Helper()
	cfg, _, _ := realStackConfig(t, base)
	for _, o := range opts {
		o(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	rt := realStackRuntime(t, ctx, cfg, filepath.Join(cfg.StateDir, "runtime"))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return &bootStack{t: t, ctx: ctx, cfg: cfg, rt: rt, image: cfg.DefaultImage, log: log}
}

// newWebStackIn is newStackIn launched (no warm slots) with the browser
// desktop as its default image.
func newWebStackIn(t *testing.T, base string) *bootStack {
	t.Helper()
	s := newStackIn(t, base)
	web := testenv.Image(t, s.ctx, s.rt.Client(), s.cfg.Containerd.Namespace, testenv.DesktopWeb)
	s.cfg.DefaultImage, s.image = web, web
	s.launch(0)
	return s
}

// deleteSandboxAtEnd deletes sandbox id when the test ends. Cleanups run
// last registered first: replicas go before their checkpoint, and the
// checkpoint before its source.
func (s *bootStack) deleteSandboxAtEnd(id string) {
	s.t.Cleanup(func() {
		if _, err := s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: id}); err != nil {
			s.t.Errorf("delete %s: %v", id, err)
		}
	})
}

// deleteCheckpointAtEnd deletes checkpoint id when the test ends.
func (s *bootStack) deleteCheckpointAtEnd(id string) {
	s.t.Cleanup(func() {
		if _, err := s.ckc.DeleteCheckpoint(context.Background(), &controldv1.DeleteCheckpointRequest{Id: id}); err != nil {
			s.t.Errorf("delete checkpoint %s: %v", id, err)
		}
	})
}

// forkOne checkpoints sandbox id live, forks one replica of it and returns
// an ACI session to the replica; the checkpoint and the replica are deleted
// when the test ends.
func (s *bootStack) forkOne(id string) *aci.Session {
	s.t.Helper()
	ckr, err := s.ckc.CreateCheckpoint(s.ctx, &controldv1.CreateCheckpointRequest{SandboxId: id})
	if err != nil {
		s.t.Fatalf("checkpoint: %v", err)
	}
	s.deleteCheckpointAtEnd(ckr.Checkpoint.Id)
	fork, err := s.ckc.ForkCheckpoint(s.ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ckr.Checkpoint.Id, Count: 1})
	if err != nil {
		s.t.Fatal(err)
	}
	r := fork.Replicas[0]
	if r.ErrorCode != 0 {
		s.t.Fatalf("replica: %s", r.ErrorMessage)
	}
	s.deleteSandboxAtEnd(r.Sandbox.Id)
	rs, err := aci.Dial(s.ctx, r.Endpoint.Url, r.Endpoint.Token)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { rs.Close() })
	return rs
}

// launch runs controld with precreate warm slots.
func (s *bootStack) launch(precreate int) {
	s.t.Helper()
	s.cfg.Boot.Precreate = precreate
	runCtx, stop := context.WithCancel(s.ctx)
	done := make(chan error, 1)
	ready := make(chan app.Addrs, 1)
	go func() {
		done <- app.Run(runCtx, s.cfg, app.Deps{Runtime: s.rt, Logger: s.log, OnReady: func(a app.Addrs) { ready <- a }})
	}()
	select {
	case s.addrs = <-ready:
	case err := <-done:
		stop()
		s.t.Fatalf("controld: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+s.addrs.GRPCUnix, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		s.t.Fatal(err)
	}
	s.conn = conn
	s.sbc = controldv1.NewSandboxServiceClient(conn)
	s.ckc = controldv1.NewCheckpointServiceClient(conn)
	s.plc = controldv1.NewPoolServiceClient(conn)
	stopped := false
	s.stopC = func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		stop()
		if err := <-done; err != nil {
			s.t.Errorf("shutdown: %v", err)
		}
	}
	s.t.Cleanup(s.stopC)
}

func (s *bootStack) stop() { s.stopC() }

// metric returns the value of an unlabelled or fully labelled series.
func (s *bootStack) metric(series string) float64 {
	s.t.Helper()
	resp, err := http.Get("http://" + s.addrs.Metrics + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				s.t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// waitSlots waits until controld reports n warm slots.
func (s *bootStack) waitSlots(n int) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.metric("forkfleet_controld_warm_slots") != float64(n) {
		if time.Now().After(deadline) {
			s.t.Fatalf("warm slots never reached %d", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// containerLabels returns the labels of sandbox id's container.
func (s *bootStack) containerLabels(id string) map[string]string {
	s.t.Helper()
	ctx := namespaces.WithNamespace(s.ctx, s.cfg.Containerd.Namespace)
	ctr, err := s.rt.Client().LoadContainer(ctx, id)
	if err != nil {
		s.t.Fatal(err)
	}
	l, err := ctr.Labels(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	return l
}

// runningDigest is the manifest digest of the image build sandbox id runs.
func (s *bootStack) runningDigest(id string) string {
	return s.containerLabels(id)["forkfleet.image-digest"]
}

// runtimeIDs returns the runtime's sandboxes by status.
func (s *bootStack) runtimeIDs(status runtime.InstanceStatus) []string {
	s.t.Helper()
	insts, err := s.rt.List(s.ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	var out []string
	for _, in := range insts {
		if in.Status == status {
			out = append(out, in.ID)
		}
	}
	slices.Sort(out)
	return out
}

// firstShot dials the sandbox's ACI through the gateway and takes a
// screenshot: the agent's view of "usable". It returns how long the dial
// took.
func firstShot(ctx context.Context, ep *controldv1.Endpoint) (time.Duration, error) {
	start := time.Now()
	sess, err := aci.Dial(ctx, ep.Url, ep.Token)
	if err != nil {
		return 0, fmt.Errorf("ACI dial: %w", err)
	}
	dial := time.Since(start)
	defer sess.Close()
	r, err := sess.Screenshot(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("screenshot: %w", err)
	}
	if len(r.GetData()) == 0 || r.GetWidth() == 0 {
		return 0, errors.New("screenshot: empty image")
	}
	return dial, nil
}

// waitStill waits until the sandbox's screen has not changed for half a
// second. A checkpoint of a desktop that has just become usable may catch
// it still painting (its shell's prompt, the focus decorations): its
// replicas are born with that frame and pass their first-frame proof, then
// finish the paint, so a later pixel verification compares a screen the
// checkpoint never showed. Tests that verify replicas again later
// checkpoint a still screen, as pools do (fleet's waitScreenStill).
func waitStill(ctx context.Context, ep *controldv1.Endpoint) error {
	sess, err := aci.Dial(ctx, ep.Url, ep.Token)
	if err != nil {
		return fmt.Errorf("ACI dial: %w", err)
	}
	defer sess.Close()
	req := aci.PNG()
	req.SettleMs, req.SettleTimeoutMs = 500, 10000
	if _, err := sess.Screenshot(ctx, req); err != nil {
		return fmt.Errorf("settled screenshot: %w", err)
	}
	return nil
}

// TestRealStackWarmSlots checks warm slots on the real stack: a default
// create takes the precreated sandbox and only starts it, the slot is
// refilled with a new identity, a non-matching create boots cold, slots
// are not sandboxes, shutdown discards them and reconciliation removes a
// crashed controld's.
func TestRealStackWarmSlots(t *testing.T) {
	s := newBootStack(t)
	ctx := s.ctx
	s.launch(1)
	s.waitSlots(1)
	slots := s.runtimeIDs(runtime.StatusCreated)
	if len(slots) != 1 {
		t.Fatalf("precreated containers %v, want one slot", slots)
	}
	list, err := s.sbc.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{})
	if err != nil || len(list.Sandboxes) != 0 {
		t.Fatalf("slots are listed: %v %v", list, err)
	}

	start := time.Now()
	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatalf("create: %v (is %s in namespace %s?)", err, s.image, s.cfg.Containerd.Namespace)
	}
	usable := time.Since(start)
	if _, err := firstShot(ctx, cr.Endpoint); err != nil {
		t.Fatal(err)
	}
	t.Logf("slot boot: usable %v, first screenshot %v", usable, time.Since(start))
	for _, p := range cr.Sandbox.Boot {
		t.Logf("  %-16s %v", p.Name, p.At.AsDuration())
	}
	if cr.Sandbox.Id != slots[0] {
		t.Fatalf("created %s, want the slot %s", cr.Sandbox.Id, slots[0])
	}
	if s.metric(`forkfleet_controld_boot_warm_slot_total{result="hit"}`) != 1 {
		t.Fatal("hit not counted")
	}
	s.waitSlots(1)
	refill := s.runtimeIDs(runtime.StatusCreated)
	if len(refill) != 1 || refill[0] == slots[0] {
		t.Fatalf("refilled slots %v", refill)
	}

	other, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Screen: &controldv1.Screen{Width: 1024, Height: 768}})
	if err != nil {
		t.Fatalf("non-matching create: %v", err)
	}
	if other.Sandbox.Id == refill[0] || !slices.Equal(s.runtimeIDs(runtime.StatusCreated), refill) {
		t.Fatal("a non-matching create took the slot")
	}
	if _, err := firstShot(ctx, other.Endpoint); err != nil {
		t.Fatal(err)
	}

	// A crashed controld's slot: created, not started, labelled, no record.
	leftover := "sb-" + randomLower(16)
	if err := s.rt.Precreate(ctx, runtime.BootSpec{
		ID: leftover, Image: s.image, Width: 1280, Height: 800, Depth: 24,
		ACIToken: randomLower(16), AdminToken: randomLower(16),
		Labels: map[string]string{fleet.LabelManaged: "controld", fleet.LabelSandboxID: leftover},
	}); err != nil {
		t.Fatal(err)
	}
	s.stop()
	if got := s.runtimeIDs(runtime.StatusCreated); !slices.Equal(got, []string{leftover}) {
		t.Fatalf("after shutdown, precreated containers %v, want only the leftover %s", got, leftover)
	}
	s.launch(1)
	s.waitSlots(1)
	if got := s.runtimeIDs(runtime.StatusCreated); len(got) != 1 || got[0] == leftover {
		t.Fatalf("after restart, precreated containers %v (leftover %s)", got, leftover)
	}
	for _, id := range []string{cr.Sandbox.Id, other.Sandbox.Id} {
		g, err := s.sbc.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: id})
		if err != nil || g.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY {
			t.Fatalf("%s after restart: %v %v", id, g, err)
		}
		if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	insts, err := s.rt.List(ctx)
	if err != nil || len(insts) != 0 {
		t.Fatalf("containers left in the namespace: %v %v", insts, err)
	}
}

// TestRealStackImageRebuilt: the default image rebuilt under its name
// while controld runs (an operator's `make image`). The warm slot of the
// old build is made again from the new one within seconds, new sandboxes
// run the new build, and a checkpoint of a sandbox on the old build still
// forks, on the old build (its pin keeps it from containerd's collector).
func TestRealStackImageRebuilt(t *testing.T) {
	s := newStackIn(t, "forkfleet-rebuild-it")
	ctx, c, ns := s.ctx, s.rt.Client(), s.cfg.Containerd.Namespace
	desktop, name := s.image, "localhost/forkfleet/rebuild-it:latest"
	oldBuild := testenv.Rebuild(t, ctx, c, ns, desktop, name, "old-"+randomLower(8))
	t.Cleanup(func() {
		if err := c.ImageService().Delete(namespaces.WithNamespace(context.Background(), ns), name); err != nil {
			t.Errorf("delete image %s: %v", name, err)
		}
	})
	s.cfg.DefaultImage, s.image = name, name
	labels, runningDigest := s.containerLabels, s.runningDigest
	// bootSlots are the warm slots in the runtime (not the fork slots a
	// checkpoint gets).
	bootSlots := func() []string {
		var out []string
		for _, id := range s.runtimeIDs(runtime.StatusCreated) {
			if labels(id)["forkfleet.from-checkpoint"] == "" {
				out = append(out, id)
			}
		}
		return out
	}
	s.launch(1)
	s.waitSlots(1)
	slot := bootSlots()
	src, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteSandboxAtEnd(src.Sandbox.Id)
	if len(slot) != 1 || src.Sandbox.Id != slot[0] || runningDigest(src.Sandbox.Id) != oldBuild.Digest.String() {
		t.Fatalf("created %s on %s, want the slot %v on the old build %s", src.Sandbox.Id, runningDigest(src.Sandbox.Id), slot, oldBuild.Digest)
	}
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteCheckpointAtEnd(ck.Checkpoint.Id)
	s.waitSlots(1)
	refill := bootSlots()

	newBuild := testenv.Rebuild(t, ctx, c, ns, desktop, name, "new-"+randomLower(8))
	testenv.CollectGarbage(t, ctx, c, ns, desktop)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ids := bootSlots()
		if len(ids) == 1 && len(refill) == 1 && ids[0] != refill[0] && runningDigest(ids[0]) == newBuild.Digest.String() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm slots %v 20 s after the rebuild (before it %v)", ids, refill)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.waitSlots(1)
	next, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteSandboxAtEnd(next.Sandbox.Id)
	if got := runningDigest(next.Sandbox.Id); got != newBuild.Digest.String() {
		t.Errorf("a create after the rebuild runs %s, want the new build %s", got, newBuild.Digest)
	}

	fork, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := fork.Replicas[0]
	if r.ErrorCode != 0 {
		t.Fatalf("fork of a checkpoint on the old build: %s", r.ErrorMessage)
	}
	s.deleteSandboxAtEnd(r.Sandbox.Id)
	if got := runningDigest(r.Sandbox.Id); got != oldBuild.Digest.String() {
		t.Errorf("the fork runs %s, want the old build %s", got, oldBuild.Digest)
	}
}

// TestBootLatency measures, on the real stack through the real gRPC API,
// request to usable and to the first screenshot answered (through the
// gateway) for: controld cold boots with and without a warm slot, boots as
// forks of a per-image boot checkpoint, and the runtime's floors (no
// controld, guestd dialled directly). The variants run interleaved, in a
// shuffled order each round, so load from elsewhere hits them alike. It
// logs p50/p90 and asserts nothing about speed. Opt in with
// FORKFLEET_INTEGRATION=1 FORKFLEET_BOOT_BENCH=1; FORKFLEET_BOOT_BENCH_N
// rounds (default 20).
func TestBootLatency(t *testing.T) {
	if os.Getenv("FORKFLEET_BOOT_BENCH") != "1" {
		t.Skip("set FORKFLEET_BOOT_BENCH=1 (with FORKFLEET_INTEGRATION=1) to measure boot latency")
	}
	s := newBootStack(t)
	ctx := s.ctx
	n := 20
	if v, err := strconv.Atoi(os.Getenv("FORKFLEET_BOOT_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	// Before each sample: let deletes and slot refills finish, so every
	// sample is one boot on an otherwise idle controld.
	const pause = 300 * time.Millisecond
	results := map[string][]time.Duration{}
	add := func(k string, d time.Duration) { results[k] = append(results[k], d) }

	spec := func() runtime.BootSpec {
		id := "sb-" + randomLower(16)
		return runtime.BootSpec{ID: id, Image: s.image, Width: 1280, Height: 800, Depth: 24,
			ACIToken: randomLower(32), AdminToken: randomLower(32),
			Labels: map[string]string{fleet.LabelManaged: "controld", fleet.LabelSandboxID: id}}
	}
	// shotUnix is the floor's view of usable: guestd's socket dialled
	// directly, desktop ready, first screenshot.
	shotUnix := func(sock guestsock.Addr, token string) error {
		var sess *aci.Session
		var err error
		for {
			if sess, err = aci.DialSandbox(ctx, sock, token); err == nil {
				break
			}
			if ctx.Err() != nil {
				return err
			}
			time.Sleep(2 * time.Millisecond)
		}
		defer sess.Close()
		if _, err := sess.WaitReady(ctx); err != nil {
			return err
		}
		_, err = sess.Screenshot(ctx, nil)
		return err
	}

	s.launch(1)
	defer s.stop()
	// Warm-up: the image's unpack check and page cache.
	if cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true}); err != nil {
		t.Fatalf("warm-up: %v", err)
	} else if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: cr.Sandbox.Id}); err != nil {
		t.Fatal(err)
	}

	// The per-image boot checkpoint: a freshly booted default desktop,
	// settled, checkpointed once; every boot-as-fork restores it.
	src, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Sandbox.Id, Name: "boot-image"})
	if err != nil {
		t.Fatalf("boot checkpoint: %v", err)
	}
	defer func() {
		if _, err := s.ckc.DeleteCheckpoint(context.Background(), &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id, Cascade: true}); err != nil {
			t.Errorf("delete checkpoint: %v", err)
		}
	}()
	if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: src.Sandbox.Id}); err != nil {
		t.Fatal(err)
	}
	// The same for the runtime floor, without controld (its restored
	// guestd knows the source's admin token).
	fsrc := spec()
	if inst, err := s.rt.Boot(ctx, fsrc); err != nil {
		t.Fatal(err)
	} else if err := shotUnix(inst.ACISocket, fsrc.AdminToken); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	fres, err := s.rt.Checkpoint(ctx, fsrc.ID, runtime.CheckpointSpec{
		Dir: filepath.Join(s.cfg.CheckpointDir, "floor-"+randomLower(8)), Tier: runtime.TierMemory})
	if err != nil {
		t.Fatalf("floor checkpoint: %v", err)
	}
	defer s.rt.DeleteCheckpoint(context.Background(), fres.Ref)
	if err := s.rt.Delete(ctx, fsrc.ID); err != nil {
		t.Fatal(err)
	}

	// controld variants: request to usable (the create or fork returned),
	// then to the first screenshot through the gateway.
	viaControld := func(name string, boot func() (*controldv1.Sandbox, *controldv1.Endpoint, error)) func() {
		return func() {
			start := time.Now()
			sb, ep, err := boot()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			add(name+": usable", time.Since(start))
			dial, err := firstShot(ctx, ep)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			add(name+": first screenshot", time.Since(start))
			add(name+":   gateway dial", dial)
			for _, p := range sb.Boot {
				add(name+":   phase "+p.Name, p.At.AsDuration())
			}
			if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: sb.Id}); err != nil {
				t.Fatal(err)
			}
		}
	}
	create := func(req *controldv1.CreateSandboxRequest) func() (*controldv1.Sandbox, *controldv1.Endpoint, error) {
		return func() (*controldv1.Sandbox, *controldv1.Endpoint, error) {
			cr, err := s.sbc.CreateSandbox(ctx, req)
			if err != nil {
				return nil, nil, err
			}
			return cr.Sandbox, cr.Endpoint, nil
		}
	}
	fork := func() (*controldv1.Sandbox, *controldv1.Endpoint, error) {
		fr, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{
			CheckpointId: ck.Checkpoint.Id, Count: 1,
			Verify: []controldv1.VerifyLevel{controldv1.VerifyLevel_VERIFY_LEVEL_NONE},
		})
		if err != nil {
			return nil, nil, err
		}
		r := fr.Replicas[0]
		if r.ErrorCode != 0 {
			return nil, nil, errors.New(r.ErrorMessage)
		}
		return r.Sandbox, r.Endpoint, nil
	}
	// Runtime floors: prepare (not timed), then boot or restore to usable.
	viaRuntime := func(name string, prepare func(runtime.BootSpec) error, start func(runtime.BootSpec) (runtime.Instance, error), token func(runtime.BootSpec) string) func() {
		return func() {
			sp := spec()
			if prepare != nil {
				if err := prepare(sp); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				time.Sleep(pause)
			}
			t0 := time.Now()
			inst, err := start(sp)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := shotUnix(inst.ACISocket, token(sp)); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			add(name, time.Since(t0))
			if err := s.rt.Delete(ctx, sp.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	boot := func(sp runtime.BootSpec) (runtime.Instance, error) { return s.rt.Boot(ctx, sp) }
	restore := func(sp runtime.BootSpec) (runtime.Instance, error) { return s.rt.Restore(ctx, sp, fres.Ref) }
	own := func(sp runtime.BootSpec) string { return sp.ACIToken }
	source := func(runtime.BootSpec) string { return fsrc.AdminToken }

	variants := map[string]func(){
		// The same boot as a default create, but with an env var, so it
		// does not match the slots: a cold boot through the same controld.
		"cold": viaControld("controld cold boot (no slot)", create(&controldv1.CreateSandboxRequest{
			WaitReady: true, Env: map[string]string{"BOOT_BENCH": "cold"}})),
		"slot":    viaControld("controld warm-slot boot", create(&controldv1.CreateSandboxRequest{WaitReady: true})),
		"fork":    viaControld("controld boot as fork", fork),
		"f-cold":  viaRuntime("floor: runtime cold boot", nil, boot, own),
		"f-pre":   viaRuntime("floor: runtime precreated boot", func(sp runtime.BootSpec) error { return s.rt.Precreate(ctx, sp) }, boot, own),
		"f-fork":  viaRuntime("floor: runtime fork", nil, restore, source),
		"f-pfork": viaRuntime("floor: runtime precreated fork", func(sp runtime.BootSpec) error { return s.rt.PrecreateRestore(ctx, sp, fres.Ref) }, restore, source),
	}
	keys := make([]string, 0, len(variants))
	for k := range variants {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for range n {
		mrand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for _, k := range keys {
			s.waitSlots(1)
			time.Sleep(pause)
			variants[k]()
		}
	}
	if hits := s.metric(`forkfleet_controld_boot_warm_slot_total{result="hit"}`); hits < float64(n) {
		t.Errorf("slot hits %v, want >= %d", hits, n)
	}

	names := make([]string, 0, len(results))
	for k := range results {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		v := slices.Clone(results[k])
		slices.Sort(v)
		t.Logf("%-50s p50 %6.1f ms  p90 %6.1f ms  min %6.1f  max %6.1f  (n=%d)", k,
			msf(v[len(v)/2]), msf(v[(len(v)*9)/10]), msf(v[0]), msf(v[len(v)-1]), len(v))
	}
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// randomLower returns n random characters of the alphabet of controld's ids.
func randomLower(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
