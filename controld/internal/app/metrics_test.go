package app_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// fakeStack is controld in this process over the fake runtime, whose
// sandboxes run a fake guestd (so ACI sessions and checkpoints work).
func fakeStack(t *testing.T) *daemon {
	t.Helper()
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
	return start(t, cfg, rt)
}

// exercise makes controld do what its metrics and dashboard show: boots, a
// checkpoint and a verified fork, pool claims (a hit and a miss), refused
// calls, an ACI session through the gateway and a refused one. It leaves
// one sandbox and the pool in place (their gauges stay non-empty).
func exercise(t *testing.T, ctx context.Context, d *daemon) {
	t.Helper()
	labels := map[string]string{"test": "exercise"}
	cr, err := d.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Labels: labels})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatalf("ACI through the gateway: %v", err)
	}
	if _, err := sess.Ping(ctx, nil); err != nil {
		t.Fatalf("ping: %v", err)
	}
	sess.Close()
	if _, err := aci.Dial(ctx, cr.Endpoint.Url, "wrong-token"); err == nil {
		t.Fatal("a wrong token reached the sandbox")
	}
	ck, err := d.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: cr.Sandbox.Id, Labels: labels})
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	fk, err := d.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 1, Labels: labels})
	if err != nil || fk.Replicas[0].ErrorCode != 0 {
		t.Fatalf("fork: %v %v", err, fk)
	}
	pl, err := d.pl.CreatePool(ctx, &controldv1.CreatePoolRequest{Name: "exercise", Size: 1, Labels: labels,
		Source: &controldv1.CreatePoolRequest_Image{Image: d.cfg.DefaultImage}})
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	// Two claims of a pool of one: a hit once the member is warm, then a
	// miss (boot on demand) while it refills.
	eventually(t, "a warm pool member", func() bool {
		p, err := d.pl.GetPool(ctx, &controldv1.GetPoolRequest{Id: pl.Pool.Id})
		return err == nil && p.Pool.Available == 1
	})
	var claimed []string
	for range 2 {
		c, err := d.pl.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: pl.Pool.Id, Labels: labels})
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		claimed = append(claimed, c.Sandbox.Id)
	}
	// Refused calls (InvalidArgument, NotFound) for the error panels.
	d.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Resources: &controldv1.Resources{MemoryBytes: 5}})
	d.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: "sb-aaaaaaaaaaaaaaaa"})
	for _, id := range append(claimed, fk.Replicas[0].Sandbox.Id) {
		if _, err := d.sb.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: id}); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
}

// scrape returns controld's /metrics.
func scrape(t *testing.T, d *daemon) []byte {
	t.Helper()
	resp, err := http.Get("http://" + d.addrs.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return body
}

// controld's metrics pass promtool's lint (names, units, help, counters'
// _total), with every family of the list present.
func TestMetricsPromtoolCheck(t *testing.T) {
	promtool := testenv.Tool(t, "promtool")
	d := fakeStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exercise(t, ctx, d)
	body := scrape(t, d)

	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	for _, want := range []string{
		"forkfleet_controld_build_info{", "forkfleet_controld_checkpoint_bytes_bucket{", "forkfleet_controld_checkpoint_disk_bytes{",
		"forkfleet_controld_checkpoint_seconds_bucket{", "forkfleet_controld_checkpoint_frozen_seconds_bucket{",
		"forkfleet_controld_gateway_sessions ", "forkfleet_controld_gateway_requests_total{code=\"101\",route=\"aci\"}",
		"forkfleet_controld_gateway_requests_total{code=\"401\",route=\"aci\"}",
		"forkfleet_controld_sandbox_cpu_seconds_total{", "forkfleet_controld_sandbox_memory_bytes{",
		"forkfleet_controld_pool_claims_total{pool=", "forkfleet_controld_api_request_seconds_count{code=\"InvalidArgument\"",
	} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, gone := range []string{"forkfleet_controld_api_errors_total", `step="total"`, `step="frozen"`} {
		if bytes.Contains(body, []byte(gone)) {
			t.Errorf("metrics still have %s", gone)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", strings.Join(grepLines(body, "forkfleet_controld_"), "\n"))
	}

	// A deleted pool's series go with it: its size, available and claims
	// by result, and its warm members' CPU, memory and disk (labelled with
	// the pool; the claimed ones were deleted by exercise).
	pools, err := d.pl.ListPools(ctx, &controldv1.ListPoolsRequest{})
	if err != nil || len(pools.Pools) != 1 {
		t.Fatalf("pools: %v %v", pools, err)
	}
	pool := pools.Pools[0].Id
	poolLabel := `pool="` + pool + `"`
	if n := len(grepLines(body, poolLabel)); n < 3 {
		t.Fatalf("before the delete, %d series of %s", n, poolLabel)
	}
	if _, err := d.pl.DeletePool(ctx, &controldv1.DeletePoolRequest{Id: pool}); err != nil {
		t.Fatalf("delete pool: %v", err)
	}
	after := scrape(t, d)
	if left := grepLines(after, poolLabel); len(left) > 0 {
		t.Errorf("series of deleted pool %s:\n%s", pool, strings.Join(left, "\n"))
	}
	cmd = exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(after)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("promtool check metrics after the pool's delete: %v\n%s", err, out)
	}
}

func grepLines(b []byte, sub string) []string {
	var out []string
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, sub) && !strings.HasPrefix(line, "#") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}
