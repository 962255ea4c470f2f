package app_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

type daemon struct {
	t      *testing.T
	cfg    *config.Config
	rt     *fleettest.Runtime
	cancel context.CancelFunc
	done   chan error
	addrs  app.Addrs
	conn   *grpc.ClientConn
	sb     controldv1.SandboxServiceClient
	ck     controldv1.CheckpointServiceClient
	pl     controldv1.PoolServiceClient
}

func testConfig(t *testing.T) *config.Config {
	// Unix socket paths are short-lived and must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "ctld")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := config.Default()
	cfg.Host = "test-host"
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.CheckpointDir = filepath.Join(dir, "ck")
	cfg.GRPC.UnixSocket = filepath.Join(dir, "controld.sock")
	cfg.GRPC.TCPAddress = "127.0.0.1:0"
	cfg.GRPC.TokenFile = ""
	cfg.Gateway.Listen = "127.0.0.1:0"
	cfg.Metrics.Listen = "127.0.0.1:0"
	cfg.BootTimeout = config.Duration(5 * time.Second)
	cfg.ShutdownTimeout = config.Duration(5 * time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func start(t *testing.T, cfg *config.Config, rt *fleettest.Runtime) *daemon {
	t.Helper()
	d := startWith(t, cfg, app.Deps{Runtime: rt, Dialer: fleettest.Dialer{R: rt}})
	d.rt = rt
	return d
}

// startWith runs controld with deps (a quiet logger and OnReady filled in)
// until the test ends.
func startWith(t *testing.T, cfg *config.Config, deps app.Deps) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemon{t: t, cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan app.Addrs, 1)
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	deps.OnReady = func(a app.Addrs) { ready <- a }
	go func() {
		d.done <- app.Run(ctx, cfg, deps)
	}()
	select {
	case d.addrs = <-ready:
	case err := <-d.done:
		t.Fatalf("controld did not start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("controld did not start in time")
	}
	// On a failed test, still stop controld (before the leak check runs).
	t.Cleanup(func() {
		d.cancel()
		select {
		case <-d.done:
		case <-time.After(15 * time.Second):
		}
	})
	conn, err := grpc.NewClient("unix://"+d.addrs.GRPCUnix, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	d.conn = conn
	d.sb = controldv1.NewSandboxServiceClient(conn)
	d.ck = controldv1.NewCheckpointServiceClient(conn)
	d.pl = controldv1.NewPoolServiceClient(conn)
	return d
}

// stop shuts controld down gracefully and checks Run's result.
func (d *daemon) stop() {
	d.t.Helper()
	d.conn.Close()
	d.cancel()
	select {
	case err := <-d.done:
		d.done <- nil // for the cleanup's wait
		if err != nil {
			d.t.Fatalf("Run returned %v", err)
		}
	case <-time.After(15 * time.Second):
		d.t.Fatal("controld did not shut down")
	}
}

func code(t *testing.T, err error, want codes.Code, field string) {
	t.Helper()
	err = errgrpc.FromGRPC(err)
	if got := errgrpc.Code(err); got != want {
		t.Fatalf("error %v: code %v, want %v", err, got, want)
	}
	if field != "" && errdefs.Field(err) != field {
		t.Fatalf("error %v: field %q, want %q", err, errdefs.Field(err), field)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestControldEndToEnd(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	cfg := testConfig(t)
	sockDir, err := os.MkdirTemp("", "gd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	rt := fleettest.NewRuntime()
	rt.SocketDir = sockDir
	rt.ListenAfter = 3 * time.Millisecond
	rt.ReadyAfter = 10 * time.Millisecond
	t.Cleanup(rt.Close)
	d := start(t, cfg, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Watch everything labelled app=e2e from the start.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	watch, err := d.sb.WatchSandboxes(wctx, &controldv1.WatchSandboxesRequest{Labels: map[string]string{"app": "e2e"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Header(); err != nil {
		t.Fatal(err)
	}

	cr, err := d.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Labels: map[string]string{"app": "e2e"}, WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	s := cr.Sandbox
	if s.State != controldv1.SandboxState_SANDBOX_STATE_READY || s.Host != "test-host" || len(s.Boot) == 0 ||
		s.Boot[0].Name != fleet.PhaseCreate || s.Boot[len(s.Boot)-1].Name != fleet.PhaseUsable {
		t.Fatalf("created %+v", s)
	}
	if !strings.HasPrefix(cr.Endpoint.Url, "ws://"+d.addrs.Gateway+"/v1/sandboxes/"+s.Id) {
		t.Fatalf("endpoint url %s, gateway %s", cr.Endpoint.Url, d.addrs.Gateway)
	}
	seen := map[controldv1.SandboxEventType]bool{}
	for !seen[controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE] || !seen[controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_PHASE] {
		ev, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Sandbox.Id != s.Id {
			t.Fatalf("watch event for %s", ev.Sandbox.Id)
		}
		seen[ev.Type] = true
	}
	if !seen[controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_CREATED] {
		t.Fatal("no CREATED event")
	}

	// The ACI through the gateway, with the endpoint's token.
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sess.Ping(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	sess.Close()
	if _, err := aci.Dial(ctx, cr.Endpoint.Url, "wrong"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("gateway with a wrong token: %v", err)
	}

	got, err := d.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: s.Id})
	if err != nil || got.Sandbox.Id != s.Id {
		t.Fatalf("get: %v", err)
	}
	list, err := d.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{Labels: map[string]string{"app": "e2e"}})
	if err != nil || len(list.Sandboxes) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}

	// Bad requests carry the right codes and field.
	_, err = d.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: "sb-aaaaaaaaaaaaaaaa"})
	code(t, err, codes.NotFound, "")
	_, err = d.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Screen: &controldv1.Screen{Width: 1, Height: 800}})
	code(t, err, codes.InvalidArgument, "screen.width")
	_, err = d.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: "ck-aaaaaaaaaaaaaaaa"})
	code(t, err, codes.InvalidArgument, "count")

	// Checkpoint, fork, tree rules.
	ckr, err := d.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: s.Id, Name: "golden"})
	if err != nil {
		t.Fatal(err)
	}
	fr, err := d.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: "golden", Count: 2, Labels: map[string]string{"app": "fork"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range fr.Replicas {
		if r.ErrorCode != 0 || len(r.Verification) != 4 {
			t.Fatalf("replica %+v", r)
		}
		// The replica's own token works through the gateway.
		rs, err := aci.Dial(ctx, r.Endpoint.Url, r.Endpoint.Token)
		if err != nil {
			t.Fatalf("replica gateway: %v", err)
		}
		rs.Close()
	}
	child, err := d.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: fr.Replicas[0].Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	if child.Checkpoint.ParentCheckpointId != ckr.Checkpoint.Id {
		t.Fatalf("lineage: %+v", child.Checkpoint)
	}
	_, err = d.ck.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: ckr.Checkpoint.Id})
	code(t, err, codes.FailedPrecondition, "")
	_, err = d.ck.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ckr.Checkpoint.Id, Reference: "reg/x:1"})
	code(t, err, codes.FailedPrecondition, "")

	// A checkpoint pool: frozen replicas, claim thaws one.
	pr, err := d.pl.CreatePool(ctx, &controldv1.CreatePoolRequest{Name: "p", Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ckr.Checkpoint.Id}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool warm", func() bool {
		g, err := d.pl.GetPool(ctx, &controldv1.GetPoolRequest{Id: pr.Pool.Id})
		return err == nil && g.Pool.Available == 1
	})
	cl, err := d.pl.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: pr.Pool.Id, Labels: map[string]string{"app": "claimed"}})
	if err != nil || !cl.Hit || cl.Sandbox.Labels[rules.PoolIDLabel] != pr.Pool.Id {
		t.Fatalf("claim: %v %v", cl, err)
	}
	if _, err := d.pl.DeletePool(ctx, &controldv1.DeletePoolRequest{Id: pr.Pool.Id}); err != nil {
		t.Fatal(err)
	}

	// TCP needs the token.
	tconn, err := grpc.NewClient(d.addrs.GRPCTCP, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	tc := controldv1.NewSandboxServiceClient(tconn)
	_, err = tc.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{})
	code(t, err, codes.Unauthenticated, "")
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+d.addrs.Token)
	if _, err := tc.ListSandboxes(actx, &controldv1.ListSandboxesRequest{}); err != nil {
		t.Fatalf("TCP with token: %v", err)
	}
	tconn.Close()
	if b, err := os.ReadFile(filepath.Join(cfg.StateDir, "api.token")); err != nil || strings.TrimSpace(string(b)) != d.addrs.Token {
		t.Fatalf("generated token file: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(cfg.StateDir, "api.token")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v", fi.Mode())
	}

	// TTL expiry.
	short, err := d.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Ttl: durationpb.New(100 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "ttl expiry", func() bool {
		_, err := d.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: short.Sandbox.Id})
		// The reaper drops the record, then the container: wait for both.
		return errgrpc.Code(errgrpc.FromGRPC(err)) == codes.NotFound && !rt.Has(short.Sandbox.Id)
	})

	// Metrics.
	resp, err := http.Get("http://" + d.addrs.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	for _, want := range []string{
		"forkfleet_controld_boot_phase_seconds_bucket", "forkfleet_controld_api_request_seconds_bucket",
		"forkfleet_controld_runtime_call_seconds_bucket", `forkfleet_controld_sandboxes{state="SANDBOX_STATE_READY"}`,
		"forkfleet_controld_checkpoint_step_seconds_bucket",
		"forkfleet_controld_checkpoint_seconds_bucket", "forkfleet_controld_checkpoint_bytes_bucket", "forkfleet_controld_build_info",
		"forkfleet_controld_sandbox_cpu_seconds_total{", "forkfleet_controld_sandbox_memory_bytes{", "forkfleet_controld_checkpoint_disk_bytes",
		"forkfleet_controld_gateway_sessions", "forkfleet_controld_gateway_requests_total{",
		"forkfleet_controld_fork_replicas_total",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// No series of the deleted pool outlives it.
	if p := `pool="` + pr.Pool.Id + `"`; strings.Contains(string(body), p) {
		for line := range strings.Lines(string(body)) {
			if strings.Contains(line, p) {
				t.Errorf("metrics still name deleted pool: %s", line)
			}
		}
	}

	// Graceful shutdown ends the watch with Unavailable; sandboxes survive
	// (warm slots, not sandboxes yet, are discarded).
	beforeIDs := rt.StartedIDs()
	before := len(beforeIDs)
	keep := s.Id
	d.stop()
	for i := 0; ; i++ {
		_, err := watch.Recv()
		if err != nil {
			break
		}
		if i > 100 {
			t.Fatal("watch survived shutdown")
		}
	}
	wcancel()
	if len(rt.StartedIDs()) != before {
		t.Fatalf("shutdown touched sandboxes: %v -> %v", beforeIDs, rt.StartedIDs())
	}

	// Restart on the same store: reconciliation adopts, fails the vanished
	// and removes the orphan.
	vanished := fr.Replicas[1].Sandbox.Id
	rt.Vanish(vanished)
	rt.Adopt(runtime.Instance{ID: "sb-orphanorphanorph", Status: runtime.StatusRunning, Labels: map[string]string{fleet.LabelManaged: "controld"}})
	d = start(t, cfg, rt)
	g, err := d.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: keep})
	if err != nil || g.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("after restart: %v %v", g, err)
	}
	g, err = d.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: vanished})
	if err != nil || g.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_FAILED {
		t.Fatalf("vanished after restart: %v %v", g, err)
	}
	if rt.Has("sb-orphanorphanorph") {
		t.Fatal("orphan survived reconciliation")
	}
	if _, err := d.ck.GetCheckpoint(ctx, &controldv1.GetCheckpointRequest{Id: "golden"}); err != nil {
		t.Fatalf("checkpoint after restart: %v", err)
	}
	if _, err := d.sb.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: keep}); err != nil {
		t.Fatal(err)
	}
	if rt.Has(keep) {
		t.Fatal("delete left the container")
	}
	d.stop()
}
