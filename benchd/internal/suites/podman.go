//go:build linux

package suites

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suite"
)

// podmanGlobal makes podman work on this host (no systemd, cgroup v1) with
// runc as its runtime.
var podmanGlobal = []string{"--cgroup-manager=cgroupfs", "--events-backend=file", "--runtime=runc"}

// podmanEnv puts criu 4.2 (/usr/local/sbin) first on PATH, as the project's
// own checkpoints use it.
func podmanEnv() []string {
	return append(os.Environ(), "PATH=/usr/local/sbin:"+os.Getenv("PATH"))
}

func podman(ctx context.Context, args ...string) (string, time.Duration, error) {
	out, d, err := runTimed(ctx, podmanEnv(), append(append([]string{"podman"}, podmanGlobal...), args...)...)
	return strings.TrimSpace(string(out)), d, err
}

// podmanCheckpointPeer measures podman checkpoint --leave-running (exported
// to a file) and restore --import of the same image controld runs, n times
// each, as baseline rows.
func podmanCheckpointPeer(ctx context.Context, env *suite.Env, image string, n int) ([]result.Row, error) {
	if _, err := lookPath("podman"); err != nil {
		return nil, fmt.Errorf("podman not installed")
	}
	tar := filepath.Join(env.WorkDir, "image.tar")
	if _, _, err := runTimed(ctx, nil, "ctr", "-a", containerdSocket, "-n", containerdNS, "images", "export", tar, image); err != nil {
		return nil, fmt.Errorf("export %s from containerd: %w", image, err)
	}
	out, _, err := podman(ctx, "load", "-q", "-i", tar)
	if err != nil {
		return nil, err
	}
	ref := image
	if i := strings.LastIndex(out, "Loaded image:"); i >= 0 {
		ref = strings.TrimSpace(strings.SplitN(out[i+len("Loaded image:"):], "\n", 2)[0])
	}
	name := fmt.Sprintf("benchd-peer-%d", time.Now().UnixNano())
	if _, _, err := podman(ctx, "run", "-d", "--name", name, "--ulimit", "nproc=4096:4096", "--ulimit", "nofile=1024:1024", ref); err != nil {
		return nil, err
	}
	defer podman(context.WithoutCancel(ctx), "rm", "-f", "-t", "0", name)
	// Let the desktop come up as it does in a sandbox before checkpointing.
	time.Sleep(5 * time.Second)
	if st, _, err := podman(ctx, "inspect", "-f", "{{.State.Status}}", name); err != nil || st != "running" {
		return nil, fmt.Errorf("podman container not running (%q): %v", st, err)
	}
	lbl := labels("shape", "bare-desktop", "tool", "podman+runc+criu")
	ck := result.NewSeries("peer.podman_checkpoint_leave_running", "ms", lbl)
	rs := result.NewSeries("peer.podman_restore_import", "ms", lbl)
	size := result.NewSeries("peer.podman_checkpoint_size", "MB", lbl)
	ck.Baseline, rs.Baseline, size.Baseline = true, true, true
	for i := 0; i < n; i++ {
		file := filepath.Join(env.WorkDir, fmt.Sprintf("ck-%d.tar.gz", i))
		_, d, err := podman(ctx, "container", "checkpoint", "--leave-running", "--export", file, name)
		if err != nil {
			ck.Fail()
			env.Progressf("podman checkpoint: %v", err)
			continue
		}
		ck.Add(suite.Ms(d))
		if st, err := os.Stat(file); err == nil {
			size.Add(float64(st.Size()) / 1e6)
		}
		restored := fmt.Sprintf("%s-r%d", name, i)
		_, d, err = podman(ctx, "container", "restore", "--import", file, "--name", restored)
		if err != nil {
			rs.Fail()
		} else {
			rs.Add(suite.Ms(d))
		}
		podman(context.WithoutCancel(ctx), "rm", "-f", "-t", "0", restored)
		os.Remove(file)
	}
	return []result.Row{ck.Row(), rs.Row(), size.Row()}, nil
}
