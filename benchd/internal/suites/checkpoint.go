//go:build linux

package suites

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// checkpointSuite measures live checkpoints of a running sandbox.
type checkpointSuite struct {
	n      int
	peer   bool
	ballMB int
}

func (*checkpointSuite) Name() string { return "checkpoint" }
func (*checkpointSuite) Description() string {
	return "live memory-tier checkpoint of a bare desktop and of a 300 MB-RAM + 100 MB-disk sandbox: total, frozen, dump, layer, sizes; podman checkpoint/restore peer"
}
func (s *checkpointSuite) Flags(fs *flag.FlagSet) {
	fs.IntVar(&s.n, "checkpoint-n", 10, "checkpoints per shape (--n overrides)")
	fs.BoolVar(&s.peer, "checkpoint-podman", true, "also measure podman checkpoint --leave-running / restore of the same image")
	fs.IntVar(&s.ballMB, "checkpoint-ram-mb", 300, "RAM held by the reference shape's ballast process (0: no reference shape)")
}

// Peers: podman's checkpoint and restore of the same container, unless
// --checkpoint-podman=false.
func (s *checkpointSuite) Peers() []string { return podmanPeers(s.peer) }

func (s *checkpointSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	return checkControld(ctx, env)
}

func (s *checkpointSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	n, warm := env.Samples(s.n), env.Warmups(1)
	resp, err := c.create(ctx)
	if err != nil {
		return nil, fmt.Errorf("create source sandbox: %w", err)
	}
	defer c.remove(ctx, resp.GetSandbox().GetId())
	image := resp.GetSandbox().GetImage()
	rows, err := s.shape(ctx, env, c, resp.GetSandbox().GetId(), "bare-desktop", n, warm)
	if err != nil {
		return nil, err
	}
	if s.ballMB <= 0 {
		env.Notef("reference shape skipped (--checkpoint-ram-mb %d)", s.ballMB)
		return append(rows, s.peerRows(ctx, env, image, n, warm, rows)...), nil
	}
	// The reference shape: RAM a process holds and touches, plus disk.
	ref, err := c.create(ctx)
	if err != nil {
		return nil, fmt.Errorf("create reference sandbox: %w", err)
	}
	defer c.remove(ctx, ref.GetSandbox().GetId())
	if err := s.ballast(ctx, ref.GetEndpoint()); err != nil {
		env.Notef("reference shape (%d MB RAM + 100 MB disk) skipped: %v", s.ballMB, err)
	} else {
		r, err := s.shape(ctx, env, c, ref.GetSandbox().GetId(), fmt.Sprintf("ram-%dMB+disk-100MB", s.ballMB), n, warm)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	return append(rows, s.peerRows(ctx, env, image, n, warm, rows)...), nil
}

// peerRows measures podman (when asked) and our ratios against it.
func (s *checkpointSuite) peerRows(ctx context.Context, env *suiteapi.Env, image string, n, warm int, ours []result.Row) []result.Row {
	if !s.peer {
		return nil
	}
	rows := s.podmanRows(ctx, env, image, n, warm)
	return append(rows, checkpointRatios(slices.Concat(ours, rows))...)
}

// podmanRows runs podman's checkpoint --leave-running and restore --import
// of the same image as baseline rows, and our bare-desktop checkpoint as
// ratios against them. A peer that cannot run is a note, not a failure.
func (s *checkpointSuite) podmanRows(ctx context.Context, env *suiteapi.Env, image string, n, warm int) []result.Row {
	peer, err := newPodmanPeer(ctx, env, image, "bare-desktop")
	if err != nil {
		env.Notef("podman peer not measured: %v", err)
		return nil
	}
	defer peer.Close(ctx)
	rows := peer.checkpointRows(ctx, n, warm)
	archive, err := peer.exportCheckpoint(ctx)
	if err != nil {
		env.Notef("podman restore not measured: export: %v", err)
	} else {
		rows = append(rows, peer.restoreRows(ctx, archive, []int{1}, n)...)
		rows = append(rows, peer.restoreRows(ctx, archive, []int{4}, max(3, n/3))...)
	}
	return rows
}

// checkpointRatios compares our bare-desktop checkpoint with podman's on
// the same image in the same run, per podman archive compression (podman
// always writes an archive; ours stays in the memory tier).
func checkpointRatios(rows []result.Row) []result.Row {
	var ours *float64
	for _, r := range rows {
		if r.Metric == "checkpoint.client_total" && r.Labels["shape"] == "bare-desktop" && !r.Baseline {
			ours = r.P50
		}
	}
	if ours == nil || *ours <= 0 {
		return nil
	}
	var out []result.Row
	for _, r := range rows {
		if r.Metric == "peer.podman_checkpoint_leave_running" && r.Baseline && r.P50 != nil {
			out = append(out, result.Single("checkpoint.speedup_vs_podman", "x",
				labels("shape", "bare-desktop", "tier", "memory", "podman_compress", r.Labels["compress"]), *r.P50 / *ours))
		}
	}
	return out
}

// ballast makes the sandbox hold ballMB of random bytes in one process's
// memory and 100 MB on disk (its writable layer: /tmp, which the agent user
// may write), using only coreutils of the minbase image: tail -c buffers the
// last N bytes of a pipe that never reaches EOF.
func (s *checkpointSuite) ballast(ctx context.Context, ep *controldv1.Endpoint) error {
	sess, err := dialEndpoint(ctx, ep)
	if err != nil {
		return err
	}
	defer sess.Close()
	r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"dd", "if=/dev/urandom", "of=/tmp/ballast", "bs=1M", "count=100"}, TimeoutMs: 120000})
	if err != nil {
		return fmt.Errorf("disk ballast: %w", err)
	}
	if r.GetExitCode() != 0 {
		return fmt.Errorf("disk ballast: dd exit %d: %s", r.GetExitCode(), r.GetStderr())
	}
	size := fmt.Sprintf("%dM", s.ballMB)
	if _, err := sess.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"sh", "-c",
		"{ head -c " + size + " /dev/urandom; exec sleep 2147483647; } | exec tail -c " + size}}); err != nil {
		return fmt.Errorf("RAM ballast: %w", err)
	}
	// Wait until tail holds the whole ballast.
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		r, err := sess.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"sh", "-c",
			"for p in /proc/[0-9]*; do if [ \"$(cat $p/comm 2>/dev/null)\" = tail ]; then grep VmRSS $p/status; fi; done"}})
		if err == nil {
			var kb int
			if _, serr := fmt.Sscanf(string(r.GetStdout()), "VmRSS: %d kB", &kb); serr == nil && kb >= s.ballMB*1024*95/100 {
				return nil
			}
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("RAM ballast did not reach %d MB within 2 minutes", s.ballMB)
}

func (s *checkpointSuite) shape(ctx context.Context, env *suiteapi.Env, c *controld, sandboxID, shape string, n, warm int) ([]result.Row, error) {
	lbl := labels("shape", shape, "tier", "memory")
	client := result.NewSeries("checkpoint.client_total", "ms", lbl)
	total := result.NewSeries("checkpoint.total", "ms", lbl)
	frozen := result.NewSeries("checkpoint.frozen", "ms", lbl)
	dump := result.NewSeries("checkpoint.dump", "ms", lbl)
	layer := result.NewSeries("checkpoint.layer", "ms", lbl)
	mem := result.NewSeries("checkpoint.memory_size", "MB", lbl)
	disk := result.NewSeries("checkpoint.layer_size", "MB", lbl)
	for i := 0; i < warm+n; i++ {
		cctx, sp := env.Tracer.Start(ctx, "checkpoint", oteltrace.WithAttributes(attribute.String("shape", shape)))
		t0 := time.Now()
		r, err := c.ck.CreateCheckpoint(cctx, &controldv1.CreateCheckpointRequest{SandboxId: sandboxID,
			Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, Labels: map[string]string{benchLabel: "1"}})
		d := time.Since(t0)
		sp.End()
		if i < warm {
			client.Warmup()
			if err == nil {
				c.removeCheckpoint(ctx, r.GetCheckpoint().GetId())
			}
			continue
		}
		if err != nil {
			client.Fail()
			env.Progressf("checkpoint %s: %v", shape, err)
			continue
		}
		ck := r.GetCheckpoint()
		client.Add(suiteapi.Ms(d))
		t := ck.GetTiming()
		total.Add(dur(t.GetTotal()))
		frozen.Add(dur(t.GetFrozen()))
		dump.Add(dur(t.GetDump()))
		layer.Add(dur(t.GetLayer()))
		mem.Add(float64(ck.GetMemoryBytes()) / 1e6)
		disk.Add(float64(ck.GetLayerBytes()) / 1e6)
		c.removeCheckpoint(ctx, ck.GetId())
		env.Progressf("checkpoint %s %d/%d: %.0f ms (frozen %.0f)", shape, i+1-warm, n, suiteapi.Ms(d), dur(t.GetFrozen()))
	}
	// The source must still be running: the checkpoint is live.
	g, err := c.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: sandboxID})
	if err != nil || g.GetSandbox().GetState() != controldv1.SandboxState_SANDBOX_STATE_READY {
		return nil, fmt.Errorf("source sandbox not running after checkpoints: %v %v", g.GetSandbox().GetState(), err)
	}
	return []result.Row{client.Row(), total.Row(), frozen.Row(), dump.Row(), layer.Row(), mem.Row(), disk.Row()}, nil
}

// golden boots a sandbox and checkpoints it at tier; the caller deletes both.
func golden(ctx context.Context, c *controld, tier controldv1.CheckpointTier) (sandboxID string, ck *controldv1.Checkpoint, err error) {
	return goldenOf(ctx, c, "", tier)
}

// goldenOf is golden for image (controld's default when empty).
func goldenOf(ctx context.Context, c *controld, image string, tier controldv1.CheckpointTier) (sandboxID string, ck *controldv1.Checkpoint, err error) {
	resp, err := c.createImage(ctx, image)
	if err != nil {
		return "", nil, fmt.Errorf("create golden sandbox: %w", err)
	}
	r, err := c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: resp.GetSandbox().GetId(), Tier: tier,
		Labels: map[string]string{benchLabel: "1"}})
	if err != nil {
		return resp.GetSandbox().GetId(), nil, fmt.Errorf("checkpoint golden: %w", err)
	}
	return resp.GetSandbox().GetId(), r.GetCheckpoint(), nil
}
