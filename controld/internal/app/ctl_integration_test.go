package app_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// TestRealStackOperatorTools drives a real controld (its binary, on
// containerd, runc and CRIU) as an operator does: grpc-health-probe,
// grpcurl through reflection, and forkfleetctl (built from this checkout)
// for the whole life of a sandbox, its checkpoint, a verified fork and a
// pool of forks, in JSON and as tables. The fake-backed tests
// (api/cmd/forkfleetctl, TestGrpcurlReflection) cover every command and
// service; this one shows they work against the real thing.
func TestRealStackOperatorTools(t *testing.T) {
	probe := testenv.Tool(t, "grpc-health-probe")
	grpcurl := testenv.Tool(t, "grpcurl")
	s := newProcStack(t)
	ctlBin := filepath.Join(filepath.Dir(s.bin), "forkfleetctl")
	if out, err := exec.CommandContext(s.ctx, "go", "build", "-o", ctlBin, "github.com/forkfleet/forkfleet/api/cmd/forkfleetctl").CombinedOutput(); err != nil {
		t.Fatalf("build forkfleetctl: %v\n%s", err, out)
	}
	s.start()
	s.cleanupAll()
	addr := "unix://" + s.cfg.GRPC.UnixSocket

	// Run after cleanupAll's deletes are registered, so first: no pool
	// refills what they delete.
	var pools []string
	t.Cleanup(func() {
		for _, id := range pools {
			if s.running() {
				s.conn.Invoke(context.Background(), controldv1.PoolService_DeletePool_FullMethodName,
					&controldv1.DeletePoolRequest{Id: id}, &controldv1.DeletePoolResponse{})
			}
		}
	})

	// READY=1 came after reconciliation: the probe says SERVING.
	if out, err := exec.Command(probe, "-addr", addr).CombinedOutput(); err != nil || !strings.Contains(string(out), "SERVING") {
		t.Fatalf("grpc-health-probe: %v %s", err, out)
	}
	out, err := exec.Command(grpcurl, "-plaintext", "-unix", s.cfg.GRPC.UnixSocket, "list").CombinedOutput()
	if err != nil {
		t.Fatalf("grpcurl list: %v %s", err, out)
	}
	for _, svc := range []string{"forkfleet.controld.v1.SandboxService", "forkfleet.controld.v1.CheckpointService",
		"forkfleet.controld.v1.PoolService", "grpc.health.v1.Health"} {
		if !strings.Contains(string(out), svc) {
			t.Errorf("grpcurl list lacks %s:\n%s", svc, out)
		}
	}

	// ctl runs forkfleetctl against this controld.
	ctl := func(args ...string) (int, string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(s.ctx, 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, ctlBin, append([]string{"--address", addr}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, stdout.String(), stderr.String()
		case errors.As(err, &ee):
			return ee.ExitCode(), stdout.String(), stderr.String()
		}
		t.Fatalf("forkfleetctl %v: %v", args, err)
		return 0, "", ""
	}
	// js runs a command that must succeed, decoding its -o json output.
	js := func(m proto.Message, args ...string) {
		t.Helper()
		code, stdout, stderr := ctl(append([]string{"-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("forkfleetctl %v: exit %d: %s", args, code, stderr)
		}
		if err := protojson.Unmarshal([]byte(stdout), m); err != nil {
			t.Fatalf("forkfleetctl %v: not a %T: %v\n%s", args, m, err, stdout)
		}
	}

	var created controldv1.CreateSandboxResponse
	js(&created, "sandbox", "create", "--label", "test=operator-tools")
	src := created.GetSandbox().GetId()
	if created.GetSandbox().GetState() != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("create: %v", created.GetSandbox())
	}
	png := filepath.Join(t.TempDir(), "src.png")
	if code, _, stderr := ctl("sandbox", "screenshot", src, "-f", png); code != 0 {
		t.Fatalf("screenshot: exit %d: %s", code, stderr)
	}
	if b, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("screenshot file: %v (%d bytes)", err, len(b))
	}

	var ck controldv1.CreateCheckpointResponse
	js(&ck, "checkpoint", "create", src, "--name", "operator-tools")
	var fork controldv1.ForkCheckpointResponse
	js(&fork, "checkpoint", "fork", "operator-tools", "-n", "1")
	if len(fork.GetReplicas()) != 1 || fork.GetReplicas()[0].GetErrorCode() != 0 {
		t.Fatalf("fork: %v", &fork)
	}
	replica := fork.GetReplicas()[0].GetSandbox().GetId()
	// A live replica re-verified: the proofs that do not depend on its
	// screen staying as it was (pixels compares the current screen).
	var verify controldv1.VerifySandboxResponse
	js(&verify, "sandbox", "verify", replica, "--level", "marker", "--level", "memory", "--level", "filesystem")
	if len(verify.GetResults()) != 3 {
		t.Fatalf("verify: %v", &verify)
	}
	for _, r := range verify.GetResults() {
		if !r.GetOk() {
			t.Errorf("verify %s: %v", replica, r)
		}
	}

	var pool controldv1.CreatePoolResponse
	js(&pool, "pool", "create", "operator-tools", "--size", "1", "--checkpoint", ck.GetCheckpoint().GetId())
	pools = append(pools, pool.GetPool().GetId())
	var claim controldv1.ClaimPoolResponse
	js(&claim, "pool", "claim", pool.GetPool().GetId())
	var resized controldv1.UpdatePoolResponse
	js(&resized, "pool", "resize", pool.GetPool().GetId(), "--size", "2")
	if resized.GetPool().GetSize() != 2 {
		t.Fatalf("resize: %v", resized.GetPool())
	}

	// Tables for people: a header and a row per sandbox.
	code, table, stderr := ctl("sandbox", "list", "--label", "test=operator-tools")
	if code != 0 || !strings.HasPrefix(table, "ID ") || !strings.Contains(table, src) {
		t.Fatalf("sandbox list: exit %d %q %s", code, table, stderr)
	}
	// What controld refuses exits 1; a usage error 2.
	if code, _, stderr := ctl("checkpoint", "get", "ck-aaaaaaaaaaaaaaaa"); code != 1 || !strings.Contains(stderr, "not found") {
		t.Errorf("get a missing checkpoint: exit %d %s", code, stderr)
	}
	if code, _, _ := ctl("checkpoint", "fork", "operator-tools", "-n", "0"); code != 2 {
		t.Errorf("fork -n 0: exit %d, want 2", code)
	}

	var deleted controldv1.DeletePoolResponse
	js(&deleted, "pool", "delete", pool.GetPool().GetId())
	pools = nil
	for _, id := range []string{claim.GetSandbox().GetId(), replica, src} {
		var d controldv1.DeleteSandboxResponse
		js(&d, "sandbox", "delete", id)
	}
	var ckDeleted controldv1.DeleteCheckpointResponse
	js(&ckDeleted, "checkpoint", "delete", "operator-tools", "--cascade")
	var left controldv1.ListSandboxesResponse
	js(&left, "sandbox", "list")
	if len(left.GetSandboxes()) != 0 {
		t.Errorf("sandboxes left: %v", left.GetSandboxes())
	}
	s.stop()
	if ids := s.containerIDs(); len(ids) != 0 {
		t.Errorf("containers left in %s: %v", s.ns, ids)
	}
}
