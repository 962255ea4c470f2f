package controldfake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/controldfake"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/api/rules"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dial(t *testing.T, target string) (*client.Client, context.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	c, err := client.Dial(ctx, target, client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ctx
}

func TestTTLAndRefill(t *testing.T) {
	srv := controldfake.Start(t)
	srv.RefillDelay = 20 * time.Millisecond
	c, ctx := dial(t, srv.Target)
	sb, err := c.CreateSandbox(ctx, client.WithTTL(30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := sb.Get(ctx)
		if errors.Is(err, errdefs.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sandbox outlived its TTL")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p, err := c.CreatePool(ctx, "p", 1, client.WithImage(controldfake.DefaultImage))
	if err != nil {
		t.Fatal(err)
	}
	if cl, err := c.ClaimPool(ctx, p.GetId()); err != nil || !cl.Hit {
		t.Fatalf("first claim: %v %v", cl, err)
	}
	for {
		p, _ = c.GetPool(ctx, p.GetId())
		if p.GetAvailable() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pool never refilled")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStartContextAndDefaultEndpoint(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	sock := filepath.Join(shortTempDir(t), "c.sock")
	srv, err := controldfake.StartContext(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	c, cctx := dial(t, srv.Target)
	sb, err := c.CreateSandbox(cctx)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := sb.Endpoint(cctx)
	if err != nil || ep.GetUrl() == "" || ep.GetToken() == "" {
		t.Fatalf("endpoint = %v, %v", ep, err)
	}
	if err := srv.SetState(sb.ID(), controldv1.SandboxState_SANDBOX_STATE_FAILED, "boom"); err != nil {
		t.Fatal(err)
	}
	if info, _ := sb.Get(cctx); info.GetStatusMessage() != "boom" {
		t.Errorf("status message = %q", info.GetStatusMessage())
	}
	cancel() // stops the server
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := c.ListSandboxes(cctx)
		if errors.Is(err, errdefs.ErrUnavailable) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server still answering after ctx cancel: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWatchEndsOnClose(t *testing.T) {
	srv := controldfake.Start(t)
	c, ctx := dial(t, srv.Target)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		var last error
		first := true
		for _, err := range c.Watch(ctx) {
			if first {
				close(started)
				first = false
			}
			last = err
		}
		done <- last
	}()
	if _, err := c.CreateSandbox(ctx); err != nil {
		t.Fatal(err)
	}
	<-started
	srv.Close()
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("watch ended with %v, want ErrUnavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not end when the server closed")
	}
}

func shortTempDir(t *testing.T) string {
	dir := filepath.Join("/tmp", "cf-"+time.Now().Format("150405.000000"))
	if err := mkdir(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeAll(dir) })
	return dir
}

// The fake applies controld's limit rules: defaults filled in, maxima
// enforced, admission refused past the host's limits (per fork replica too).
func TestLimitsAndAdmission(t *testing.T) {
	srv := controldfake.Start(t)
	srv.Limits = limits.Default()
	srv.Limits.MaxSandboxes = 2
	c, ctx := dial(t, srv.Target)
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	if got := sb.Info().GetResources(); got.GetDiskBytes() != srv.Limits.Default.GetDiskBytes() || got.GetPidsMax() != srv.Limits.Default.GetPidsMax() {
		t.Fatalf("effective limits %v", got)
	}
	_, err = c.CreateSandbox(ctx, client.WithResources(&controldv1.Resources{MemoryBytes: 1 << 40}))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "resources.memory_bytes" {
		t.Fatalf("over the maximum: %v", err)
	}
	ck, err := sb.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := ck.Fork(ctx, 2, client.WithResources(&controldv1.Resources{PidsMax: 100}))
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 || reps[0].Sandbox.Info().GetResources().GetPidsMax() != 100 ||
		!errors.Is(reps[1].Err, errdefs.ErrResourceExhausted) {
		t.Fatalf("fork of 2 on a host with room for 1: %+v", reps)
	}
	_, err = c.CreateSandbox(ctx)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || errdefs.Reason(err) != limits.ReasonHostFull {
		t.Fatalf("past admission: %v", err)
	}
}

func TestReachLimit(t *testing.T) {
	srv := controldfake.Start(t)
	c, ctx := dial(t, srv.Target)
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.ReachLimit(sb.ID(), controldv1.SandboxLimit_SANDBOX_LIMIT_DISK, 1, "disk full"); err != nil {
		t.Fatal(err)
	}
	info, err := sb.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r := info.GetLimitsReached(); len(r) != 1 || r[0].GetLimit() != controldv1.SandboxLimit_SANDBOX_LIMIT_DISK || r[0].GetCount() != 1 {
		t.Fatalf("limits reached %v", r)
	}
}

// The fake keeps run_as_root like controld: on the sandbox, its
// checkpoints and their forks.
func TestRunAsRoot(t *testing.T) {
	srv := controldfake.Start(t)
	c, ctx := dial(t, srv.Target)
	plain, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil || plain.Info().GetRunAsRoot() {
		t.Fatalf("default sandbox: %v %v", plain.Info(), err)
	}
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady(), client.WithRunAsRoot())
	if err != nil || !sb.Info().GetRunAsRoot() {
		t.Fatalf("root sandbox: %v %v", sb.Info(), err)
	}
	ck, err := sb.Checkpoint(ctx)
	if err != nil || !ck.Info().GetRunAsRoot() {
		t.Fatalf("checkpoint: %v %v", ck.Info(), err)
	}
	results, err := ck.Fork(ctx, 1)
	if err != nil || results[0].Err != nil || !results[0].Sandbox.Info().GetRunAsRoot() {
		t.Fatalf("fork: %+v %v", results, err)
	}
}

// Registry checkpoints in the fake as in controld: a pushed export can be
// pulled or forked by reference (one import per reference, no name), and a
// fork names either a checkpoint or a reference.
func TestRegistryCheckpoints(t *testing.T) {
	srv := controldfake.Start(t)
	c, ctx := dial(t, srv.Target)
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	ck, err := sb.Checkpoint(ctx, client.WithName("reached"))
	if err != nil {
		t.Fatal(err)
	}
	const ref = "registry.test/ck:1"
	if _, _, err := c.ForkRemote(ctx, ref, 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("fork of a reference never pushed: %v", err)
	}
	ex, err := ck.Export(ctx, ref, client.WithPush())
	if err != nil || ex.GetPushedBytes() == 0 {
		t.Fatalf("push: %v %v", ex, err)
	}
	res, imported, err := c.ForkRemote(ctx, ref, 2)
	if err != nil || client.FirstError(res) != nil || len(client.Sandboxes(res)) != 2 || imported.ID() == ck.ID() {
		t.Fatalf("fork by reference: %+v %v", res, err)
	}
	_, again, err := c.ForkRemote(ctx, ref, 1)
	if err != nil || again.ID() != imported.ID() {
		t.Fatalf("second fork by reference forked %v (%v), want the import %s", again, err, imported.ID())
	}
	pulled, err := c.ImportCheckpoint(ctx, ref, client.WithPull())
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("pull of a checkpoint whose name is taken here: %v %v", pulled, err)
	}
	_, err = c.CheckpointService().ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.ID(), CheckpointReference: ref, Count: 1})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("fork of both a checkpoint and a reference: %v", err)
	}
}

// TestViewTicket: the fake validates CreateViewTicket as controld does.
func TestViewTicket(t *testing.T) {
	srv := controldfake.Start(t)
	c, ctx := dial(t, srv.Target)
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.SandboxService().CreateViewTicket(ctx, &controldv1.CreateViewTicketRequest{SandboxId: sb.ID(), Control: true})
	if err != nil || r.Ticket == "" || !strings.Contains(r.Url, "/v1/sandboxes/"+sb.ID()+"/view?ticket=") {
		t.Fatalf("ticket %v: %v", r, err)
	}
	_, err = c.SandboxService().CreateViewTicket(ctx, &controldv1.CreateViewTicketRequest{SandboxId: sb.ID(), Ttl: durationpb.New(time.Hour)})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a ttl past the maximum: %v", err)
	}
	_, err = c.SandboxService().CreateViewTicket(ctx, &controldv1.CreateViewTicketRequest{SandboxId: "sb-zzzzzzzzzzzzzzzz"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("an unknown sandbox: %v", err)
	}
}

// TestRecordings: the fake's recordings follow controld's lifecycle: one
// running per sandbox, stopped when the sandbox goes, replicas of a
// recorded source recorded with their parents, and exports of a recording
// without frames refused as controld refuses them.
func TestRecordings(t *testing.T) {
	srv := controldfake.Start(t)
	c, ctx := dial(t, srv.Target)
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	rec, first, err := sb.StartRecording(ctx, 0)
	if err != nil || first.GetMaxBytes() != rules.DefaultRecordingBytes || first.GetState() != controldv1.RecordingState_RECORDING_STATE_RECORDING {
		t.Fatalf("start %v: %v", first, err)
	}
	if _, _, err := sb.StartRecording(ctx, 0); errdefs.Reason(err) != "SANDBOX_RECORDING" {
		t.Fatalf("a second recording: %v", err)
	}
	ck, err := sb.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := ck.Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		got, err := c.Recording(r.Replica.GetRecordingId()).Get(ctx)
		if err != nil || got.GetParentRecordingId() != rec.ID() || got.GetParentCheckpointId() != ck.ID() || got.GetSandboxId() != r.Sandbox.ID() {
			t.Fatalf("replica recording %v: %v", got, err)
		}
	}
	if _, err := rec.ExportMP4(ctx, 0); errdefs.Reason(err) != "RECORDING_RUNNING" {
		t.Fatalf("export while running: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "rec.mp4")
	if _, err := rec.Download(ctx, controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY, dst); errdefs.Reason(err) != "RECORDING_RUNNING" {
		t.Fatalf("download while running: %v", err)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := rec.Get(ctx)
	if err != nil || got.GetStopReason() != controldv1.RecordingStopReason_RECORDING_STOP_REASON_SANDBOX_GONE {
		t.Fatalf("after the sandbox went: %v %v", got, err)
	}
	if _, err := rec.ExportFrames(ctx); errdefs.Reason(err) != "RECORDING_EMPTY" {
		t.Fatalf("export of an empty recording: %v", err)
	}
	if _, err := rec.Download(ctx, controldv1.RecordingFile_RECORDING_FILE_MP4, dst); errdefs.Reason(err) != "RECORDING_NOT_EXPORTED" {
		t.Fatalf("download of an MP4 not exported: %v", err)
	}
	if _, err := rec.Download(ctx, controldv1.RecordingFile_RECORDING_FILE_UNSPECIFIED, dst); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("download of no file: %v", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused download left %s: %v", dst, err)
	}
	if err := rec.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Get(ctx); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a deleted recording: %v", err)
	}
}
