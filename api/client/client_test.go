package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/controldfake"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T) (*client.Client, *controldfake.Server, context.Context) {
	t.Helper()
	srv := controldfake.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	c, err := client.Dial(ctx, srv.Target, client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, srv, ctx
}

func TestSandboxLifecycle(t *testing.T) {
	c, _, ctx := setup(t)
	sb, err := c.CreateSandbox(ctx, client.WithScreen(1024, 768, 0), client.WithResources(&controldv1.Resources{CpuMillis: 2000, MemoryBytes: 1 << 30}),
		client.WithEnv(map[string]string{"LANG": "C.UTF-8"}), client.WithLabels(map[string]string{"job": "a"}),
		client.WithTTL(time.Hour), client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	info := sb.Info()
	if info.GetState() != controldv1.SandboxState_SANDBOX_STATE_READY || info.GetScreen().GetWidth() != 1024 ||
		info.GetScreen().GetDepth() != 24 || info.GetExpiresAt() == nil || info.GetLabels()["job"] != "a" {
		t.Fatalf("info = %v", info)
	}
	if got, err := c.GetSandbox(ctx, sb.ID()); err != nil || got.Info().GetId() != sb.ID() {
		t.Fatalf("GetSandbox = %v, %v", got, err)
	}
	if _, err := sb.WaitReady(ctx, client.WithTimeout(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := sb.Suspend(ctx); err != nil || sb.Info().GetState() != controldv1.SandboxState_SANDBOX_STATE_SUSPENDED {
		t.Fatalf("Suspend: %v, %v", err, sb.Info().GetState())
	}
	if err := sb.Suspend(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("suspend twice: %v", err)
	}
	if err := sb.Resume(ctx); err != nil || sb.Info().GetState() != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("Resume: %v", err)
	}
	ep, err := sb.Endpoint(ctx)
	if err != nil || ep.GetUrl() == "" || ep.GetToken() == "" {
		t.Fatalf("Endpoint = %v, %v", ep, err)
	}
	if ep2, err := sb.RefreshEndpoint(ctx); err != nil || ep2.GetUrl() != ep.GetUrl() {
		t.Fatalf("RefreshEndpoint = %v, %v", ep2, err)
	}
	list, err := c.ListSandboxes(ctx, client.WithLabels(map[string]string{"job": "a"}),
		client.WithStates(controldv1.SandboxState_SANDBOX_STATE_READY))
	if err != nil || len(list) != 1 {
		t.Fatalf("ListSandboxes = %v, %v", list, err)
	}
	if list, _ := c.ListSandboxes(ctx, client.WithLabels(map[string]string{"job": "b"})); len(list) != 0 {
		t.Errorf("label filter: %v", list)
	}
	if _, err := sb.Verify(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("verify a cold boot: %v", err)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = sb.Get(ctx)
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Reason(err) != "SANDBOX_NOT_FOUND" {
		t.Fatalf("after delete: %v (reason %q)", err, errdefs.Reason(err))
	}
	if err := sb.Delete(ctx); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete twice: %v", err)
	}
}

func TestValidationErrors(t *testing.T) {
	c, _, ctx := setup(t)
	for _, tc := range []struct {
		name  string
		opts  []client.CreateOption
		field string
	}{
		{"screen", []client.CreateOption{client.WithScreen(10, 800, 24)}, "screen.width"},
		{"depth", []client.CreateOption{client.WithScreen(800, 600, 12)}, "screen.depth"},
		{"memory", []client.CreateOption{client.WithResources(&controldv1.Resources{MemoryBytes: 1024})}, "resources.memory_bytes"},
		{"cpu", []client.CreateOption{client.WithResources(&controldv1.Resources{CpuMillis: -1})}, "resources.cpu_millis"},
		{"disk over the maximum", []client.CreateOption{client.WithResources(&controldv1.Resources{DiskBytes: 1 << 50})}, "resources.disk_bytes"},
		{"pids below the floor", []client.CreateOption{client.WithResources(&controldv1.Resources{PidsMax: 3})}, "resources.pids_max"},
		{"labels", []client.CreateOption{client.WithLabels(map[string]string{"bad key": "x"})}, `labels["bad key"]`},
		{"ttl", []client.CreateOption{client.WithTTL(-time.Second)}, "ttl"},
		{"env", []client.CreateOption{client.WithEnv(map[string]string{"A=B": "x"})}, `env["A=B"]`},
	} {
		_, err := c.CreateSandbox(ctx, tc.opts...)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want invalid argument", tc.name, err)
			continue
		}
		if got := errdefs.Field(err); got != tc.field {
			t.Errorf("%s: field = %q, want %q", tc.name, got, tc.field)
		}
	}
	_, err := c.CreateSandbox(ctx, client.WithImage("nope:latest"))
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Reason(err) != "IMAGE_NOT_FOUND" {
		t.Errorf("unknown image: %v", err)
	}
	_, err = c.Sandbox("").Get(ctx)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "id" {
		t.Errorf("empty id: %v", err)
	}
}

func TestCheckpointForkLineage(t *testing.T) {
	c, srv, ctx := setup(t)
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	ck, err := sb.Checkpoint(ctx, client.WithName("golden"), client.WithTier(controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY),
		client.WithLabels(map[string]string{"exp": "1"}))
	if err != nil {
		t.Fatal(err)
	}
	if ck.Info().GetSourceSandboxId() != sb.ID() || ck.Info().GetTier() != controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY {
		t.Fatalf("checkpoint = %v", ck.Info())
	}
	if _, err := sb.Checkpoint(ctx, client.WithName("golden")); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("duplicate name: %v", err)
	}
	byName, err := c.GetCheckpoint(ctx, "golden")
	if err != nil || byName.ID() != ck.ID() {
		t.Fatalf("by name: %v, %v", byName, err)
	}

	srv.FailReplica = func(_ string, i int) error {
		if i == 2 {
			return errdefs.WithReason(errdefs.ErrResourceExhausted, "NO_MEMORY", "replica %d: out of memory", i)
		}
		return nil
	}
	results, err := ck.Fork(ctx, 4, client.WithLabels(map[string]string{"fork": "yes"}), client.WithTTL(time.Hour),
		client.WithVerify(controldv1.VerifyLevel_VERIFY_LEVEL_MARKER, controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY))
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 4 {
		t.Fatalf("%d results", len(results))
	}
	if !errors.Is(results[2].Err, errdefs.ErrResourceExhausted) || results[2].Sandbox != nil {
		t.Errorf("replica 2 = %+v", results[2])
	}
	if err := client.FirstError(results); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("FirstError = %v", err)
	}
	replicas := client.Sandboxes(results)
	if len(replicas) != 3 {
		t.Fatalf("%d usable replicas", len(replicas))
	}
	for _, r := range results {
		if r.Sandbox == nil {
			continue
		}
		if r.Sandbox.Info().GetCheckpointId() != ck.ID() || r.Sandbox.Info().GetGeneration() != 1 || len(r.Verification) != 2 {
			t.Errorf("replica = %v, verification %v", r.Sandbox.Info(), r.Verification)
		}
	}
	if res, err := replicas[0].Verify(ctx); err != nil || len(res) != 4 {
		t.Errorf("Verify = %v, %v", res, err)
	}
	if _, err := ck.Fork(ctx, 65); !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "count" {
		t.Errorf("fork 65: %v", err)
	}
	if _, err := ck.Fork(ctx, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("fork 0: %v", err)
	}
	if _, err := c.Checkpoint("ck-aaaaaaaaaaaaaaaa").Fork(ctx, 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("fork missing: %v", err)
	}
	if _, err := c.Checkpoint("ck-missing").Fork(ctx, 1); errdefs.Field(err) != "checkpoint_id" {
		t.Errorf("fork of a malformed id: %v", err)
	}
	info, _ := ck.Get(ctx)
	if info.GetLiveForks() != 3 {
		t.Errorf("live forks = %d", info.GetLiveForks())
	}

	// A checkpoint of a replica is a child; the parent cannot go first.
	child, err := replicas[0].Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if child.Info().GetParentCheckpointId() != ck.ID() {
		t.Fatalf("child parent = %q", child.Info().GetParentCheckpointId())
	}
	lineage, err := c.ListCheckpoints(ctx, client.WithRoot(ck.ID()))
	if err != nil || len(lineage) != 2 {
		t.Fatalf("lineage = %v, %v", lineage, err)
	}
	if l, _ := c.ListCheckpoints(ctx, client.WithLabels(map[string]string{"exp": "1"})); len(l) != 1 {
		t.Errorf("label filter: %d", len(l))
	}
	_, err = ck.Delete(ctx)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || errdefs.Reason(err) != "CHECKPOINT_HAS_CHILDREN" {
		t.Fatalf("delete parent: %v", err)
	}
	exp, err := ck.Export(ctx, "registry.example/ck:v1")
	if err != nil || exp.GetDigest() == "" {
		t.Fatalf("Export = %v, %v", exp, err)
	}
	// An import keeps the checkpoint's name, which must be free here.
	if _, err := c.ImportCheckpoint(ctx, "registry.example/ck:v1"); !errors.Is(err, errdefs.ErrAlreadyExists) || errdefs.Reason(err) != "CHECKPOINT_NAME_TAKEN" {
		t.Fatalf("import while the name is taken: %v", err)
	}
	if _, err := c.ImportCheckpoint(ctx, "registry.example/none:v1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("import unknown: %v", err)
	}
	deleted, err := ck.Delete(ctx, client.WithCascade())
	if err != nil || len(deleted) != 2 {
		t.Fatalf("cascade = %v, %v", deleted, err)
	}
	imported, err := c.ImportCheckpoint(ctx, "registry.example/ck:v1")
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if imported.ID() == ck.ID() || imported.Info().GetName() != "golden" || imported.Info().GetLabels()["exp"] != "1" {
		t.Fatalf("Import = %v", imported.Info())
	}
	// Checkpoint with stop.
	sb2, _ := c.CreateSandbox(ctx)
	if _, err := sb2.Checkpoint(ctx, client.WithStop(), client.WithTier(controldv1.CheckpointTier_CHECKPOINT_TIER_DISK)); err != nil {
		t.Fatal(err)
	}
	if info, _ := sb2.Get(ctx); info.GetState() != controldv1.SandboxState_SANDBOX_STATE_STOPPED {
		t.Errorf("after stop: %v", info.GetState())
	}
	if _, err := sb2.Checkpoint(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("checkpoint a stopped sandbox: %v", err)
	}
}

func TestPools(t *testing.T) {
	c, srv, ctx := setup(t)
	srv.RefillDelay = -1 // no refill: the third claim misses
	p, err := c.CreatePool(ctx, "warm", 2, client.WithImage(controldfake.DefaultImage), client.WithScreen(800, 600, 24))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreatePool(ctx, "warm", 2, client.WithImage(controldfake.DefaultImage)); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("duplicate pool: %v", err)
	}
	if _, err := c.CreatePool(ctx, "nosrc", 2); !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "source" {
		t.Errorf("no source: %v", err)
	}
	if _, err := c.CreatePool(ctx, "big", 100, client.WithImage(controldfake.DefaultImage)); errdefs.Field(err) != "size" {
		t.Errorf("size 100: %v", err)
	}
	var hits int
	for i := range 3 {
		cl, err := c.ClaimPool(ctx, p.GetId(), client.WithLabels(map[string]string{"n": "x"}), client.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if cl.Hit {
			hits++
		}
		if cl.Sandbox.Info().GetPoolId() != p.GetId() || cl.Sandbox.Info().GetScreen().GetWidth() != 800 {
			t.Errorf("claim %d: %v", i, cl.Sandbox.Info())
		}
	}
	if hits != 2 {
		t.Errorf("hits = %d, want 2", hits)
	}
	got, err := c.GetPool(ctx, p.GetId())
	if err != nil || got.GetHits() != 2 || got.GetMisses() != 1 || got.GetAvailable() != 0 {
		t.Fatalf("pool = %v, %v", got, err)
	}
	pools, err := c.ListPools(ctx)
	if err != nil || len(pools) != 1 {
		t.Fatalf("ListPools = %v, %v", pools, err)
	}
	// A checkpoint pool keeps frozen replicas.
	sb, _ := c.CreateSandbox(ctx)
	ck, _ := sb.Checkpoint(ctx)
	cp, err := c.CreatePool(ctx, "frozen", 1, client.FromCheckpoint(ck.ID()))
	if err != nil || !cp.GetFrozen() {
		t.Fatalf("checkpoint pool = %v, %v", cp, err)
	}
	cl, err := c.ClaimPool(ctx, cp.GetId())
	if err != nil || cl.Sandbox.Info().GetCheckpointId() != ck.ID() {
		t.Fatalf("claim from checkpoint pool: %v", err)
	}
	if err := c.DeletePool(ctx, p.GetId()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ClaimPool(ctx, p.GetId()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("claim deleted pool: %v", err)
	}
}

func TestWatch(t *testing.T) {
	c, srv, ctx := setup(t)
	srv.BootDelay = 20 * time.Millisecond
	existing, err := c.CreateSandbox(ctx, client.WithLabels(map[string]string{"w": "1"}), client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan *client.Event, 64)
	done := make(chan error, 1)
	go func() {
		defer close(events)
		for ev, err := range c.Watch(wctx, client.WithLabels(map[string]string{"w": "1"})) {
			if err != nil {
				done <- err
				return
			}
			events <- ev
		}
		done <- nil
	}()
	next := func() *client.Event {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-time.After(5 * time.Second):
			t.Fatal("no event")
			return nil
		}
	}
	if ev := next(); ev.GetType() != controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_EXISTING || ev.GetSandbox().GetId() != existing.ID() {
		t.Fatalf("first event = %v", ev)
	}
	// Not matching the filter: no events.
	if _, err := c.CreateSandbox(ctx, client.WithLabels(map[string]string{"w": "2"})); err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, client.WithLabels(map[string]string{"w": "1"}))
	if err != nil {
		t.Fatal(err)
	}
	if sb.Info().GetState() != controldv1.SandboxState_SANDBOX_STATE_BOOTING {
		t.Fatalf("state = %v, want BOOTING with a boot delay", sb.Info().GetState())
	}
	if _, err := sb.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var types []controldv1.SandboxEventType
	for {
		ev := next()
		if ev.GetSandbox().GetId() != sb.ID() {
			t.Fatalf("event for another sandbox: %v", ev)
		}
		types = append(types, ev.GetType())
		if ev.GetType() == controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE {
			break
		}
	}
	if types[0] != controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_CREATED || len(types) != 10 {
		t.Errorf("events = %v, want CREATED, 8 PHASE, STATE", types)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.GetType() != controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_DELETED {
		t.Errorf("event = %v, want DELETED", ev)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watch ended with %v after cancel", err)
	}
}

func TestWaitReadyTimeoutAndFailure(t *testing.T) {
	c, srv, ctx := setup(t)
	srv.BootDelay = time.Hour
	sb, err := c.CreateSandbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.WaitReady(ctx, client.WithTimeout(30*time.Millisecond)); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("timeout: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := sb.WaitReady(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ctx deadline: %v", err)
	}
	srv.SetState(sb.ID(), controldv1.SandboxState_SANDBOX_STATE_FAILED, "xvfb crashed")
	if _, err := sb.WaitReady(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("failed sandbox: %v", err)
	}
}

func TestAuth(t *testing.T) {
	srv := controldfake.Start(t)
	srv.Token = "s3cret"
	ctx := context.Background()
	bad, err := client.Dial(ctx, srv.Target, client.WithToken("wrong"))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.ListSandboxes(ctx); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("wrong token: %v", err)
	}
	tokenFile := filepath.Join(t.TempDir(), "api.token")
	os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600)
	good, err := client.Dial(ctx, srv.Target, client.WithTokenFile(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if _, err := good.ListSandboxes(ctx); err != nil {
		t.Errorf("good token: %v", err)
	}
	if _, err := client.Dial(ctx, "not a target"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad target: %v", err)
	}
	// A token over plaintext TCP to a remote host is refused unless allowed.
	if _, err := client.Dial(ctx, "192.0.2.1:7443", client.WithToken("x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("token over plaintext: %v", err)
	}
	remote, err := client.Dial(ctx, "192.0.2.1:7443", client.WithToken("x"), client.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	remote.Close()
	local, err := client.Dial(ctx, "127.0.0.1:7443", client.WithToken("x"))
	if err != nil {
		t.Fatal(err)
	}
	local.Close()
}

func TestSandboxACI(t *testing.T) {
	c, srv, ctx := setup(t)
	guest := acitest.NewServer()
	defer guest.Close()
	guest.Token = "tok"
	sock := filepath.Join(t.TempDir(), "aci.sock")
	unixGuest, err := acitest.NewUnixServer(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer unixGuest.Close()
	unixGuest.Token = "tok"
	unixGuest.SandboxID = "via-unix"
	guest.SandboxID = "via-gateway"
	// This process stands in for the sandbox's init: its root is the
	// sandbox root the unix endpoint is resolved in.
	self, err := guestsock.Self(sock)
	if err != nil {
		t.Fatal(err)
	}
	start := self.Start
	srv.SetEndpoint(func(sb *controldv1.Sandbox) *controldv1.Endpoint {
		return &controldv1.Endpoint{Url: guest.URL(), Token: "tok", UnixPath: self.String(), UnixPidStart: start}
	})
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	s, err := sb.ACI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Welcome().GetSandboxId() != "via-unix" {
		t.Errorf("auto route used %q, want the reachable unix socket", s.Welcome().GetSandboxId())
	}
	s.Close()
	s, err = sb.ACI(ctx, client.ViaGateway(), client.WithDialOptions(aci.WithClientName("t")))
	if err != nil {
		t.Fatal(err)
	}
	if s.Welcome().GetSandboxId() != "via-gateway" {
		t.Errorf("gateway route used %q", s.Welcome().GetSandboxId())
	}
	if _, err := s.Step(ctx, nil, aci.PNG()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// An unreachable socket falls back to the gateway.
	srv.SetEndpoint(func(sb *controldv1.Sandbox) *controldv1.Endpoint {
		gone := guestsock.Addr{PID: self.PID, Start: start, Path: filepath.Join(t.TempDir(), "gone.sock")}
		return &controldv1.Endpoint{Url: guest.URL(), Token: "tok", UnixPath: gone.String(), UnixPidStart: start}
	})
	sb2, _ := c.CreateSandbox(ctx)
	s, err = sb2.ACI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Welcome().GetSandboxId() != "via-gateway" {
		t.Errorf("fallback used %q", s.Welcome().GetSandboxId())
	}
	s.Close()
	if _, err := sb2.ACI(ctx, client.ViaUnix()); err == nil {
		t.Error("ViaUnix with an unreachable socket succeeded")
	}
}

// Creating calls: the client gives each one a request id (so its retries
// are safe); WithRequestID makes repeats return the first result. Lists
// follow their pages; a sandbox's TTL is extended; a pool resized.
func TestRequestIDsPagesExtendUpdatePool(t *testing.T) {
	c, _, ctx := setup(t)
	mine := client.WithLabels(map[string]string{"t": "req"})
	a, err := c.CreateSandbox(ctx, mine, client.WithRequestID("job-7"), client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateSandbox(ctx, mine, client.WithRequestID("job-7"), client.WithWaitReady())
	if err != nil || b.ID() != a.ID() {
		t.Fatalf("repeat: %v %v", b, err)
	}
	if _, err := c.CreateSandbox(ctx, client.WithRequestID("job-7")); errdefs.Field(err) != "request_id" {
		t.Fatalf("reused for another request: %v", err)
	}
	// Without an id, each call is its own: the raw service too (the
	// client's interceptor sets a fresh id on a copy of the request).
	req := &controldv1.CreateSandboxRequest{Labels: map[string]string{"t": "req"}}
	for range 2 {
		if _, err := c.SandboxService().CreateSandbox(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if req.GetRequestId() != "" {
		t.Fatal("the caller's request was changed")
	}
	all, err := c.ListSandboxes(ctx, mine, client.WithPageSize(1))
	if err != nil || len(all) != 3 || all[0].GetId() != a.ID() {
		t.Fatalf("all pages: %d %v", len(all), err)
	}
	page, next, err := c.ListSandboxesPage(ctx, "", mine, client.WithPageSize(2))
	if err != nil || len(page) != 2 || next == "" {
		t.Fatalf("first page: %d %q %v", len(page), next, err)
	}
	if rest, next2, err := c.ListSandboxesPage(ctx, next, mine, client.WithPageSize(2)); err != nil || len(rest) != 1 || next2 != "" {
		t.Fatalf("second page: %d %q %v", len(rest), next2, err)
	}

	if err := a.Extend(ctx, time.Hour); err != nil || a.Info().GetExpiresAt() == nil {
		t.Fatalf("Extend: %v %v", a.Info(), err)
	}
	if err := a.Extend(ctx, -time.Second); errdefs.Field(err) != "ttl" {
		t.Fatalf("Extend by a negative TTL: %v", err)
	}
	p, err := c.CreatePool(ctx, "resize", 1, client.WithImage(controldfake.DefaultImage))
	if err != nil {
		t.Fatal(err)
	}
	if up, err := c.UpdatePool(ctx, p.GetId(), 4); err != nil || up.GetSize() != 4 {
		t.Fatalf("UpdatePool: %v %v", up, err)
	}
	if _, err := c.UpdatePool(ctx, p.GetId(), 65); errdefs.Field(err) != "size" {
		t.Fatalf("UpdatePool 65: %v", err)
	}
	if pools, err := c.ListPools(ctx, client.WithPageSize(1)); err != nil || len(pools) != 1 {
		t.Fatalf("ListPools: %v %v", pools, err)
	}
}
