package fleet_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

type env struct {
	t      *testing.T
	rt     *fleettest.Runtime
	dir    string
	st     *store.Store
	m      *fleet.Manager
	tweak  func(*fleet.Options)
	closed bool
}

func newEnv(t *testing.T, tweak func(*fleet.Options)) *env {
	t.Helper()
	e := &env{t: t, rt: fleettest.NewRuntime(), dir: t.TempDir(), tweak: tweak}
	e.rt.ReadyAfter = 5 * time.Millisecond
	e.start()
	t.Cleanup(func() {
		e.stop()
		e.rt.Close()
	})
	return e
}

func (e *env) start() {
	e.t.Helper()
	st, err := store.Open(filepath.Join(e.dir, "state.db"))
	if err != nil {
		e.t.Fatal(err)
	}
	opts := fleet.Options{
		Runtime: e.rt, Dialer: fleettest.Dialer{R: e.rt}, Store: st,
		Host: "test-host", GatewayHost: "127.0.0.1:7480", DefaultImage: "img:latest",
		CheckpointDir: filepath.Join(e.dir, "checkpoints"), BootTimeout: 5 * time.Second,
		ReapInterval: 10 * time.Millisecond, PoolRetry: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if e.tweak != nil {
		e.tweak(&opts)
	}
	m, err := fleet.New(context.Background(), opts)
	if err != nil {
		st.Close()
		e.t.Fatal(err)
	}
	e.st, e.m, e.closed = st, m, false
}

func (e *env) stop() {
	if e.closed {
		return
	}
	e.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.m.Close(ctx); err != nil {
		e.t.Error(err)
	}
	e.st.Close()
}

func (e *env) restart() {
	e.stop()
	e.start()
}

func (e *env) ready(labels map[string]string) *controldv1.Sandbox {
	e.t.Helper()
	s, _, err := e.m.CreateSandbox(context.Background(), &controldv1.CreateSandboxRequest{Labels: labels, WaitReady: true})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func wantCode(t *testing.T, err error, code codes.Code, field string) {
	t.Helper()
	if got := errgrpc.Code(err); got != code {
		t.Fatalf("error %v: code %v, want %v", err, got, code)
	}
	if field != "" {
		if got := errdefs.Field(err); got != field {
			t.Fatalf("error %v: field %q, want %q", err, got, field)
		}
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// wantPhases fails unless boot names exactly want's milestones, in order
// and at non-decreasing offsets.
func wantPhases(t *testing.T, boot []*controldv1.BootPhase, want ...string) {
	t.Helper()
	var names []string
	for _, p := range boot {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, want) {
		t.Fatalf("boot phases %v, want %v", names, want)
	}
	for i := 1; i < len(boot); i++ {
		if boot[i].At.AsDuration() < boot[i-1].At.AsDuration() {
			t.Fatalf("waterfall not ordered: %v", boot)
		}
	}
}

func TestCreateWaitGetListDelete(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s, ep, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Labels: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.State != controldv1.SandboxState_SANDBOX_STATE_BOOTING && s.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("state after create = %v", s.State)
	}
	if ep.Url != "ws://127.0.0.1:7480/v1/sandboxes/"+s.Id+"/aci" || ep.Token == "" || ep.UnixPath == "" {
		t.Fatalf("endpoint %+v", ep)
	}
	got, err := e.m.WaitSandboxReady(ctx, s.Id, durationpb.New(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != controldv1.SandboxState_SANDBOX_STATE_READY || got.ReadyAt == nil || got.Host != "test-host" {
		t.Fatalf("ready sandbox %+v", got)
	}
	wantPhases(t, got.Boot, "create", "task_start", "guestd_listening", "x_up", "painted", "windows_mapped", "focused", "usable")
	if s.Screen.Width != 1280 || s.Screen.Height != 800 || s.Screen.Depth != 24 || s.Image != "img:latest" {
		t.Fatalf("defaults not applied: %+v", s)
	}
	other := e.ready(map[string]string{"team": "b"})
	list, _, err := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{Labels: map[string]string{"team": "a"}})
	if err != nil || len(list) != 1 || list[0].Id != s.Id {
		t.Fatalf("list by label: %v %v", list, err)
	}
	list, _, _ = e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{States: []controldv1.SandboxState{controldv1.SandboxState_SANDBOX_STATE_READY}})
	if len(list) != 2 {
		t.Fatalf("list by state: %d", len(list))
	}
	if err := e.m.DeleteSandbox(ctx, s.Id); err != nil {
		t.Fatal(err)
	}
	if e.rt.Has(s.Id) {
		t.Fatal("runtime instance survived delete")
	}
	_, err = e.m.GetSandbox(ctx, s.Id)
	wantCode(t, err, codes.NotFound, "")
	if err := e.m.DeleteSandbox(ctx, s.Id); err != nil {
		t.Fatalf("repeated delete: %v", err)
	}
	wantCode(t, e.m.DeleteSandbox(ctx, "sb-aaaaaaaaaaaaaaaa"), codes.NotFound, "")
	recs, _ := e.st.Sandboxes()
	if len(recs) != 1 || recs[0].Sandbox.Id != other.Id {
		t.Fatalf("store after delete: %d records", len(recs))
	}
}

func TestValidationNamesField(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	cases := []struct {
		req   *controldv1.CreateSandboxRequest
		field string
	}{
		{&controldv1.CreateSandboxRequest{Image: "bad image"}, "image"},
		{&controldv1.CreateSandboxRequest{Resources: &controldv1.Resources{CpuMillis: 1}}, "resources.cpu_millis"},
		{&controldv1.CreateSandboxRequest{Resources: &controldv1.Resources{MemoryBytes: -5}}, "resources.memory_bytes"},
		{&controldv1.CreateSandboxRequest{Screen: &controldv1.Screen{Width: 10, Height: 800}}, "screen.width"},
		{&controldv1.CreateSandboxRequest{Screen: &controldv1.Screen{Width: 800, Height: 800, Depth: 7}}, "screen.depth"},
		{&controldv1.CreateSandboxRequest{Env: map[string]string{"1X": "v"}}, `env["1X"]`},
		{&controldv1.CreateSandboxRequest{Env: map[string]string{"FORKFLEET_TOKEN": "v"}}, `env["FORKFLEET_TOKEN"]`},
		{&controldv1.CreateSandboxRequest{Labels: map[string]string{"bad key!": "v"}}, `labels["bad key!"]`},
		{&controldv1.CreateSandboxRequest{Ttl: durationpb.New(-time.Second)}, "ttl"},
	}
	for _, c := range cases {
		_, _, err := e.m.CreateSandbox(ctx, c.req)
		wantCode(t, err, codes.InvalidArgument, c.field)
	}
	_, err := e.m.GetSandbox(ctx, "nope")
	wantCode(t, err, codes.InvalidArgument, "id")
	_, err = e.m.GetSandbox(ctx, "sb-aaaaaaaaaaaaaaaa")
	wantCode(t, err, codes.NotFound, "")
	_, err = e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: "ck-aaaaaaaaaaaaaaaa", Count: 65})
	wantCode(t, err, codes.InvalidArgument, "count")
	_, err = e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Size: 1})
	wantCode(t, err, codes.InvalidArgument, "source")
	if e.rt.Calls("boot") != 0 {
		t.Fatal("an invalid request reached the runtime")
	}
}

func TestBootFailureAndReadinessTimeout(t *testing.T) {
	e := newEnv(t, func(o *fleet.Options) { o.BootTimeout = 200 * time.Millisecond })
	ctx := context.Background()
	e.rt.BootErr = func(runtime.BootSpec) error {
		return errdefs.WithReason(errdefs.ErrNotFound, "IMAGE_NOT_FOUND", "image missing")
	}
	_, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{})
	wantCode(t, err, codes.NotFound, "")
	// Waiting for readiness, the caller gets the runtime's error too (not
	// the DELETED state of the record the failure dropped).
	_, _, err = e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	wantCode(t, err, codes.NotFound, "")
	if !strings.Contains(err.Error(), "image missing") {
		t.Fatalf("create waiting for readiness: %v, want the runtime's error", err)
	}
	if l, _, _ := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{}); len(l) != 0 {
		t.Fatalf("failed create left %d records", len(l))
	}
	e.rt.BootErr = nil
	e.rt.NeverReady = true
	s, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.m.WaitSandboxReady(ctx, s.Id, nil)
	wantCode(t, err, codes.FailedPrecondition, "")
	got, _ := e.m.GetSandbox(ctx, s.Id)
	if got.State != controldv1.SandboxState_SANDBOX_STATE_FAILED || got.StatusMessage == "" {
		t.Fatalf("never-ready sandbox: %v %q", got.State, got.StatusMessage)
	}
	if e.rt.Has(s.Id) {
		t.Fatal("failed sandbox's container left behind")
	}
}

func TestWatchEventsAndSlowWatcher(t *testing.T) {
	e := newEnv(t, func(o *fleet.Options) { o.WatchBuffer = 4 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := e.ready(map[string]string{"w": "1"})
	w, err := e.m.WatchSandboxes(ctx, &controldv1.WatchSandboxesRequest{Labels: map[string]string{"w": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-w.C
	if ev.Type != controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_EXISTING || ev.Sandbox.Id != first.Id {
		t.Fatalf("first event %v", ev)
	}
	// A fast reader sees CREATED ... DELETED of a new sandbox.
	fast, err := e.m.WatchSandboxes(ctx, &controldv1.WatchSandboxesRequest{Ids: []string{first.Id}})
	if err != nil {
		t.Fatal(err)
	}
	<-fast.C // EXISTING
	go e.m.DeleteSandbox(ctx, first.Id)
	var types []controldv1.SandboxEventType
	for ev := range fast.C {
		types = append(types, ev.Type)
		if ev.Type == controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_DELETED {
			break
		}
	}
	if types[len(types)-1] != controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_DELETED {
		t.Fatalf("events %v", types)
	}
	// The label watcher never reads: it overflows and is dropped, and the
	// manager carries on.
	for range 3 {
		e.ready(map[string]string{"w": "1"})
	}
	eventually(t, "slow watcher dropped", func() bool { return w.Err() != nil })
	wantCode(t, w.Err(), codes.ResourceExhausted, "")
	n := 0
	for range w.C {
		n++
	}
	if n > 4 {
		t.Fatalf("dropped watcher delivered %d buffered events, buffer is 4", n)
	}
}

func TestSuspendResumeTTLAndExit(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.ready(nil)
	got, err := e.m.SuspendSandbox(ctx, s.Id)
	if err != nil || got.State != controldv1.SandboxState_SANDBOX_STATE_SUSPENDED || e.rt.Status(s.Id) != runtime.StatusFrozen {
		t.Fatalf("suspend: %v %v", got, err)
	}
	if _, err := e.m.SuspendSandbox(ctx, s.Id); err != nil {
		t.Fatalf("suspend is not idempotent: %v", err)
	}
	_, err = e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: s.Id})
	wantCode(t, err, codes.FailedPrecondition, "")
	got, err = e.m.ResumeSandbox(ctx, s.Id)
	if err != nil || got.State != controldv1.SandboxState_SANDBOX_STATE_READY || e.rt.Status(s.Id) != runtime.StatusRunning {
		t.Fatalf("resume: %v %v", got, err)
	}

	short, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Ttl: durationpb.New(50 * time.Millisecond)})
	if err != nil || short.ExpiresAt == nil {
		t.Fatalf("ttl create: %v %v", short, err)
	}
	eventually(t, "ttl expiry", func() bool {
		_, err := e.m.GetSandbox(ctx, short.Id)
		return errgrpc.Code(err) == codes.NotFound && !e.rt.Has(short.Id)
	})

	e.rt.Exit(s.Id, 3)
	eventually(t, "exit marks STOPPED", func() bool {
		got, _ := e.m.GetSandbox(ctx, s.Id)
		return got.State == controldv1.SandboxState_SANDBOX_STATE_STOPPED
	})
	got, _ = e.m.GetSandbox(ctx, s.Id)
	if got.StatusMessage == "" {
		t.Fatal("stopped sandbox has no status message")
	}
}

func TestCheckpointForkVerifyTree(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id, Name: "golden", Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Tier != controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY || len(ck.VerifyLevels) != 4 || ck.Timing.GetTotal() == nil || ck.SourceSandboxId != src.Id {
		t.Fatalf("checkpoint %+v", ck)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "checkpoints", ck.Id)); err != nil {
		t.Fatalf("checkpoint dir not in place: %v", err)
	}
	_, err = e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id, Name: "golden"})
	wantCode(t, err, codes.AlreadyExists, "")
	byName, err := e.m.GetCheckpoint(ctx, "golden")
	if err != nil || byName.Id != ck.Id {
		t.Fatalf("get by name: %v %v", byName, err)
	}

	// The source goes away; forking still works.
	if err := e.m.DeleteSandbox(ctx, src.Id); err != nil {
		t.Fatal(err)
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 3, Labels: map[string]string{"fork": "1"}}))
	if err != nil {
		t.Fatal(err)
	}
	seenTokens := map[string]bool{}
	for _, r := range reps {
		if r.ErrorCode != 0 {
			t.Fatalf("replica failed: %s", r.ErrorMessage)
		}
		if len(r.Verification) != 4 {
			t.Fatalf("verification %v", r.Verification)
		}
		for _, v := range r.Verification {
			if !v.Ok {
				t.Fatalf("verify %v: %s", v.Level, v.Detail)
			}
		}
		s := r.Sandbox
		if s.State != controldv1.SandboxState_SANDBOX_STATE_READY || s.CheckpointId != ck.Id || s.Generation != 1 {
			t.Fatalf("replica %+v", s)
		}
		g := e.rt.Guest(s.Id)
		if g.Restored() != 1 || g.SandboxID() != s.Id || g.ACIToken() != r.Endpoint.Token || len(g.Entropy()) == 0 || g.Generation() != 1 {
			t.Fatalf("replica %s not told who it is", s.Id)
		}
		if seenTokens[r.Endpoint.Token] {
			t.Fatal("replicas share an ACI token")
		}
		seenTokens[r.Endpoint.Token] = true
	}
	got, _ := e.m.GetCheckpoint(ctx, ck.Id)
	if got.LiveForks != 3 {
		t.Fatalf("live forks %d", got.LiveForks)
	}
	res, err := e.m.VerifySandbox(ctx, &controldv1.VerifySandboxRequest{Id: reps[0].Sandbox.Id})
	if err != nil || len(res) != 4 || !res[0].Ok || !res[1].Ok || !res[2].Ok {
		t.Fatalf("verify sandbox: %v %v", res, err)
	}

	// A checkpoint of a fork is the golden's child.
	child, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: reps[0].Sandbox.Id, Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_DISK})
	if err != nil {
		t.Fatal(err)
	}
	if child.ParentCheckpointId != ck.Id || len(child.VerifyLevels) != 1 {
		t.Fatalf("child %+v", child)
	}
	got, _ = e.m.GetCheckpoint(ctx, ck.Id)
	if len(got.ChildIds) != 1 || got.ChildIds[0] != child.Id {
		t.Fatalf("child ids %v", got.ChildIds)
	}
	tree, _, _ := e.m.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{RootId: ck.Id})
	if len(tree) != 2 {
		t.Fatalf("tree %d", len(tree))
	}
	// Disk-tier fork: marker verified, generation 2.
	dreps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: child.Id, Count: 1}))
	if err != nil || dreps[0].ErrorCode != 0 || dreps[0].Sandbox.Generation != 2 {
		t.Fatalf("disk fork: %v %v", dreps, err)
	}
	// Its desktop booted fresh: the waterfall has a boot's guest milestones.
	wantPhases(t, dreps[0].Sandbox.Boot, "create", "task_start", "guestd_listening", "x_up", "painted", "windows_mapped", "focused", "usable")
	_, err = e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: child.Id, Count: 1, Verify: []controldv1.VerifyLevel{controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY}})
	wantCode(t, err, codes.InvalidArgument, "verify[0]")

	// Children and live forks block deletion.
	_, err = e.m.DeleteCheckpoint(ctx, ck.Id, false)
	wantCode(t, err, codes.FailedPrecondition, "")
	_, err = e.m.DeleteCheckpoint(ctx, ck.Id, true)
	wantCode(t, err, codes.FailedPrecondition, "")
	all, _, _ := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{})
	for _, s := range all {
		if err := e.m.DeleteSandbox(ctx, s.Id); err != nil {
			t.Fatal(err)
		}
	}
	deleted, err := e.m.DeleteCheckpoint(ctx, ck.Id, true)
	if err != nil || len(deleted) != 2 || deleted[0] != child.Id {
		t.Fatalf("cascade delete: %v %v", deleted, err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "checkpoints", ck.Id)); !os.IsNotExist(err) {
		t.Fatal("checkpoint dir survived delete")
	}
	if len(e.rt.DeletedCheckpoints()) != 2 {
		t.Fatal("runtime checkpoints not released")
	}
}

func TestForkPartialFailureLeavesNothing(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	e.rt.OnRestore = func(spec runtime.BootSpec, g *fleettest.Guestd) {
		if n.Add(1) == 2 {
			g.SetFrameHash([]byte("different screen"))
		}
	}
	e.rt.RestoreErr = func(spec runtime.BootSpec, _ runtime.CheckpointRef) error {
		if spec.Labels[fleet.LabelSandboxID] == "" {
			return errors.New("no sandbox label")
		}
		return nil
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 4}))
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, r := range reps {
		if r.ErrorCode != 0 {
			failed++
			if codes.Code(r.ErrorCode) != codes.FailedPrecondition || r.Sandbox != nil || len(r.Verification) != 4 {
				t.Fatalf("failed replica report %+v", r)
			}
		}
	}
	if failed != 1 {
		t.Fatalf("%d replicas failed, want 1", failed)
	}
	// Only the source and the 3 good replicas remain, in runtime and store.
	if ids := e.rt.IDs(); len(ids) != 4 {
		t.Fatalf("runtime holds %d sandboxes, want 4", len(ids))
	}
	recs, _ := e.st.Sandboxes()
	if len(recs) != 4 {
		t.Fatalf("store holds %d sandboxes, want 4", len(recs))
	}
	e.rt.RestoreErr = func(runtime.BootSpec, runtime.CheckpointRef) error {
		return errdefs.WithReason(errdefs.ErrUnavailable, "", "criu failed")
	}
	reps, _ = replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 2}))
	for _, r := range reps {
		if codes.Code(r.ErrorCode) != codes.Unavailable {
			t.Fatalf("restore failure code %v", r.ErrorCode)
		}
	}
}

// An animating page: the replica's current frame is always past the
// checkpoint's, but the frame it was restored with (Restored) is the
// checkpoint's, so the pixel proof passes; a replica restored with another
// screen still fails it.
func TestForkOfAnimatingPagePassesPixelProof(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src := e.ready(nil)
	e.rt.Guest(src.Id).SetAnimating(true)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	e.rt.OnRestore = func(_ runtime.BootSpec, g *fleettest.Guestd) {
		if n.Add(1) == 3 {
			g.SetFrameHash([]byte("a different screen"))
		}
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 3}))
	if err != nil {
		t.Fatal(err)
	}
	ok, failed, live := 0, 0, ""
	for _, r := range reps {
		if r.ErrorCode == 0 {
			ok++
			live = r.Sandbox.GetId()
			continue
		}
		failed++
		if codes.Code(r.ErrorCode) != codes.FailedPrecondition || !strings.Contains(r.ErrorMessage, "first frame hash") {
			t.Fatalf("replica failed with %v %q, want the pixel proof", codes.Code(r.ErrorCode), r.ErrorMessage)
		}
	}
	if ok != 2 || failed != 1 {
		t.Fatalf("%d replicas verified and %d failed, want 2 and 1", ok, failed)
	}
	// Re-verifying a live replica compares its current screen, which has
	// moved on: that is not the checkpoint's any more.
	res, err := e.m.VerifySandbox(ctx, &controldv1.VerifySandboxRequest{Id: live})
	if err != nil || len(res) != 4 || res[2].Ok {
		t.Fatalf("verify live replica: %v %v", res, err)
	}
}

func TestCrashRecoveryAndReconcile(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	keep := e.ready(nil)
	vanish := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: keep.Id})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: keep.Id})
	if err != nil {
		t.Fatal(err)
	}
	e.stop()
	// While controld is down: a checkpoint dir is lost, a temp dir from an
	// interrupted checkpoint and an unreferenced dir appear, a container
	// vanishes and an orphan appears.
	ckdir := filepath.Join(e.dir, "checkpoints")
	os.RemoveAll(filepath.Join(ckdir, gone.Id))
	os.MkdirAll(filepath.Join(ckdir, ".tmp-ck-half"), 0o700)
	os.MkdirAll(filepath.Join(ckdir, "ck-unreferenced"), 0o700)
	e.rt.Vanish(vanish.Id)
	e.rt.Adopt(runtime.Instance{ID: "sb-orphanorphanorph", Status: runtime.StatusRunning, Labels: map[string]string{fleet.LabelManaged: "controld"}})
	e.rt.Adopt(runtime.Instance{ID: "someone-else", Status: runtime.StatusRunning})
	e.start()

	got, err := e.m.GetSandbox(ctx, keep.Id)
	if err != nil || got.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("surviving sandbox: %v %v", got, err)
	}
	got, err = e.m.GetSandbox(ctx, vanish.Id)
	if err != nil || got.State != controldv1.SandboxState_SANDBOX_STATE_FAILED {
		t.Fatalf("vanished sandbox: %v %v", got, err)
	}
	if e.rt.Has("sb-orphanorphanorph") {
		t.Fatal("orphan container not removed")
	}
	if !e.rt.Has("someone-else") {
		t.Fatal("a container controld does not own was removed")
	}
	if _, err := e.m.GetCheckpoint(ctx, ck.Id); err != nil {
		t.Fatalf("complete checkpoint lost: %v", err)
	}
	_, err = e.m.GetCheckpoint(ctx, gone.Id)
	wantCode(t, err, codes.NotFound, "")
	entries, _ := os.ReadDir(ckdir)
	if len(entries) != 1 || entries[0].Name() != ck.Id {
		var names []string
		for _, en := range entries {
			names = append(names, en.Name())
		}
		t.Fatalf("checkpoint dir holds %v, want only %s", names, ck.Id)
	}
}

func TestCheckpointFailureLeavesNoHalfCheckpoint(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src := e.ready(nil)
	e.rt.CheckpointErr = func(string) error { return errdefs.WithReason(errdefs.ErrInternal, "", "criu dump failed") }
	_, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	wantCode(t, err, codes.Internal, "")
	list, _, _ := e.m.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{})
	entries, _ := os.ReadDir(filepath.Join(e.dir, "checkpoints"))
	if len(list) != 0 || len(entries) != 0 {
		t.Fatalf("failed checkpoint left %d records, %d dirs", len(list), len(entries))
	}
	_, err = e.m.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: "ck-aaaaaaaaaaaaaaaa", Reference: "r"})
	wantCode(t, err, codes.NotFound, "")
	e.rt.CheckpointErr = nil
	ck, _ := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	_, err = e.m.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ck.Id, Reference: "r"})
	wantCode(t, err, codes.FailedPrecondition, "")
	_, err = e.m.ImportCheckpoint(ctx, &controldv1.ImportCheckpointRequest{Reference: "r"})
	wantCode(t, err, codes.FailedPrecondition, "")
}

func TestPools(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Name: "img", Source: &controldv1.CreatePoolRequest_Image{Image: "img:latest"}, Size: 2, Labels: map[string]string{"pool": "img"}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "image pool filled", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		return got.Available == 2
	})
	s, ep, hit, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id, Labels: map[string]string{"user": "x"}, Ttl: durationpb.New(time.Hour)})
	if err != nil || !hit || ep.Token == "" {
		t.Fatalf("claim: hit=%v err=%v", hit, err)
	}
	if s.Labels[rules.PoolIDLabel] != p.Id || s.Labels["user"] != "x" || s.PoolId != p.Id || s.ExpiresAt == nil || s.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("claimed sandbox %+v", s)
	}
	eventually(t, "image pool refilled", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		return got.Available == 2
	})

	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id}, Size: 1})
	if err != nil || !cp.Frozen {
		t.Fatalf("checkpoint pool %v %v", cp, err)
	}
	eventually(t, "checkpoint pool filled", func() bool {
		got, _ := e.m.GetPool(ctx, cp.Id)
		return got.Available == 1
	})
	var warm string
	for _, id := range e.rt.IDs() {
		if e.rt.Status(id) == runtime.StatusFrozen {
			warm = id
		}
	}
	if warm == "" {
		t.Fatal("checkpoint pool replica is not frozen")
	}
	_, err = e.m.DeleteCheckpoint(ctx, ck.Id, false)
	wantCode(t, err, codes.FailedPrecondition, "")
	s, _, hit, _, err = e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: cp.Id})
	if err != nil || !hit || s.Id != warm || e.rt.Status(warm) != runtime.StatusRunning || s.Generation != 1 {
		t.Fatalf("frozen claim: %v hit=%v err=%v", s, hit, err)
	}
	// Drain the pool faster than it refills: a miss forks on demand.
	e.rt.RestoreErr = func(runtime.BootSpec, runtime.CheckpointRef) error { return nil }
	got, _ := e.m.GetPool(ctx, cp.Id)
	if got.Available == 0 {
		s, _, hit, _, err = e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: cp.Id})
		if err != nil || hit || s.State != controldv1.SandboxState_SANDBOX_STATE_READY {
			t.Fatalf("miss claim: %v hit=%v err=%v", s, hit, err)
		}
	}
	got, _ = e.m.GetPool(ctx, cp.Id)
	if got.Hits < 1 {
		t.Fatalf("pool counters %+v", got)
	}
	// Restart: pools and their warm members come back.
	e.restart()
	eventually(t, "pool after restart", func() bool {
		got, err := e.m.GetPool(ctx, p.Id)
		return err == nil && got.Available == 2 && got.Hits == 1
	})
	if err := e.m.DeletePool(ctx, p.Id); err != nil {
		t.Fatal(err)
	}
	left, _, _ := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{Labels: map[string]string{"pool": "img"}})
	for _, s := range left {
		if s.Labels[rules.PoolIDLabel] == "" {
			t.Fatalf("unclaimed pool sandbox %s survived DeletePool", s.Id)
		}
	}
	if len(left) != 1 {
		t.Fatalf("claimed sandbox should survive DeletePool; left %d", len(left))
	}
}

func TestInterruptedBootResumesAfterRestart(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.rt.ReadyAfter = time.Hour
	s, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.stop()
	// guestd becomes ready while controld is down.
	e.rt.Guest(s.Id).SetReadyAt(time.Now())
	e.start()
	got, err := e.m.WaitSandboxReady(ctx, s.Id, durationpb.New(5*time.Second))
	if err != nil || got.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("resumed boot: %v %v", got, err)
	}
}

func TestBootSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := newEnv(t, func(o *fleet.Options) { o.Tracer = tp.Tracer("test") })
	e.ready(nil)
	names := map[string]bool{}
	for _, s := range rec.Ended() {
		names[s.Name()] = true
	}
	for _, want := range []string{"sandbox.boot", "boot.create", "boot.task_start", "boot.guestd_listening", "boot.x_up", "boot.painted", "boot.windows_mapped", "boot.focused", "boot.usable"} {
		if !names[want] {
			t.Errorf("no %s span (have %v)", want, names)
		}
	}
}

// replicasOf is a ForkCheckpoint answer's replicas.
func replicasOf(resp *controldv1.ForkCheckpointResponse, err error) ([]*controldv1.ForkReplica, error) {
	return resp.GetReplicas(), err
}

// TestForkRestoreModes: LAZY restores every replica lazily and completes
// their pages once all are verified; AUTO is lazy only for a checkpoint
// with enough pages on a host where it is safe; a runtime that cannot
// restore lazily fails LAZY clearly and AUTO restores eagerly.
func TestForkRestoreModes(t *testing.T) {
	e := newEnv(t, func(o *fleet.Options) { o.LazyMinBytes = 100 << 20 })
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	var lazySpecs atomic.Int32
	e.rt.OnRestore = func(spec runtime.BootSpec, _ *fleettest.Guestd) {
		if spec.LazyRestore {
			lazySpecs.Add(1)
		}
	}
	fork := func(mode controldv1.RestoreMode, n uint32) []*controldv1.ForkReplica {
		t.Helper()
		reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: n, RestoreMode: mode}))
		if err != nil {
			t.Fatalf("fork %v: %v", mode, err)
		}
		return reps
	}
	want := func(reps []*controldv1.ForkReplica, mode controldv1.RestoreMode) {
		t.Helper()
		for _, r := range reps {
			if r.ErrorCode != 0 || r.GetRestoreMode() != mode {
				t.Fatalf("replica %+v, want restored %v", r, mode)
			}
		}
	}
	lazy := fork(controldv1.RestoreMode_RESTORE_MODE_LAZY, 3)
	want(lazy, controldv1.RestoreMode_RESTORE_MODE_LAZY)
	if got := lazySpecs.Load(); got != 3 {
		t.Errorf("%d lazy restores, want 3", got)
	}
	if got := e.rt.Completed(); len(got) != 3 {
		t.Errorf("completed %v, want the 3 replicas", got)
	}
	want(fork(controldv1.RestoreMode_RESTORE_MODE_UNSPECIFIED, 1), controldv1.RestoreMode_RESTORE_MODE_EAGER) // 0 bytes: AUTO is eager
	e.rt.LazyPageBytes = 300 << 20
	want(fork(controldv1.RestoreMode_RESTORE_MODE_AUTO, 1), controldv1.RestoreMode_RESTORE_MODE_LAZY)
	want(fork(controldv1.RestoreMode_RESTORE_MODE_EAGER, 1), controldv1.RestoreMode_RESTORE_MODE_EAGER)
	e.rt.LazyUnsafe = true
	want(fork(controldv1.RestoreMode_RESTORE_MODE_AUTO, 1), controldv1.RestoreMode_RESTORE_MODE_EAGER)
	e.rt.LazyErr = errdefs.WithReason(errdefs.ErrFailedPrecondition, "LAZY_RESTORE_UNAVAILABLE", "no page server")
	want(fork(controldv1.RestoreMode_RESTORE_MODE_AUTO, 1), controldv1.RestoreMode_RESTORE_MODE_EAGER)
	if _, err := e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1,
		RestoreMode: controldv1.RestoreMode_RESTORE_MODE_LAZY}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("LAZY without lazy restore: %v, want FAILED_PRECONDITION", err)
	}
	disk, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id, Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_DISK})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: disk.Id, Count: 1,
		RestoreMode: controldv1.RestoreMode_RESTORE_MODE_LAZY}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("LAZY fork of a disk-tier checkpoint: %v, want INVALID_ARGUMENT", err)
	}
}
