package fleet

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Collector returns the metrics read when Prometheus scrapes: each running
// sandbox's CPU time, memory and disk (a runtime implementing UsageProbe,
// LimitProbe for the disk), labelled with its id and, for a warm pool
// member, its pool; and what the checkpoints hold. Register it once.
func (m *Manager) Collector() prometheus.Collector { return &collector{m: m} }

var (
	descSandboxCPU = prometheus.NewDesc("forkfleet_controld_sandbox_cpu_seconds_total",
		"CPU time of all of a sandbox's processes since its task started.", []string{"sandbox", "pool"}, nil)
	descSandboxMemory = prometheus.NewDesc("forkfleet_controld_sandbox_memory_bytes",
		"Memory charged to a sandbox now (page cache included), against its resources.memory_bytes.", []string{"sandbox", "pool"}, nil)
	descSandboxMemoryLimit = prometheus.NewDesc("forkfleet_controld_sandbox_memory_limit_bytes",
		"A sandbox's memory limit.", []string{"sandbox", "pool"}, nil)
	descSandboxDisk = prometheus.NewDesc("forkfleet_controld_sandbox_disk_bytes",
		"Bytes a sandbox's writable layer holds, against its resources.disk_bytes.", []string{"sandbox", "pool"}, nil)
	descCheckpointDisk = prometheus.NewDesc("forkfleet_controld_checkpoint_disk_bytes",
		"Bytes the live checkpoints hold, by part (memory: CRIU's images under checkpoint_dir; layer: their writable layers in containerd).",
		[]string{"part"}, nil)
	descCheckpoints = prometheus.NewDesc("forkfleet_controld_checkpoints",
		"Checkpoints recorded.", nil, nil)
	descCheckpointFree = prometheus.NewDesc("forkfleet_controld_checkpoint_dir_available_bytes",
		"Space left for unprivileged writes on checkpoint_dir's filesystem (checkpoints fail when it runs out).", nil, nil)
)

type collector struct{ m *Manager }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxCPU, descSandboxMemory, descSandboxMemoryLimit, descSandboxDisk,
		descCheckpointDisk, descCheckpoints, descCheckpointFree} {
		ch <- d
	}
}

// scrapeTimeout bounds the runtime reads of one scrape (they are file reads
// of a few microseconds each).
const scrapeTimeout = 5 * time.Second

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	type row struct {
		id, pool string
		memLimit int64
	}
	m.mu.Lock()
	var running []row
	for _, sb := range m.sandboxes {
		switch sb.rec.Sandbox.GetState() {
		case controldv1.SandboxState_SANDBOX_STATE_BOOTING, controldv1.SandboxState_SANDBOX_STATE_READY,
			controldv1.SandboxState_SANDBOX_STATE_SUSPENDED:
			if sb.deleting {
				continue
			}
			// pool names the pool holding a member warm; a claimed sandbox
			// is the caller's and may outlive its pool.
			pool := ""
			if sb.rec.Pooled {
				pool = sb.rec.Sandbox.GetPoolId()
			}
			running = append(running, row{sb.rec.Sandbox.GetId(), pool, sb.rec.Sandbox.GetResources().GetMemoryBytes()})
		}
	}
	var memBytes, layerBytes int64
	for _, ck := range m.checkpoints {
		memBytes += ck.Checkpoint.GetMemoryBytes()
		layerBytes += ck.Checkpoint.GetLayerBytes()
	}
	n := len(m.checkpoints)
	m.mu.Unlock()

	ch <- prometheus.MustNewConstMetric(descCheckpointDisk, prometheus.GaugeValue, float64(memBytes), "memory")
	ch <- prometheus.MustNewConstMetric(descCheckpointDisk, prometheus.GaugeValue, float64(layerBytes), "layer")
	ch <- prometheus.MustNewConstMetric(descCheckpoints, prometheus.GaugeValue, float64(n))
	var st unix.Statfs_t
	if err := unix.Statfs(m.opts.CheckpointDir, &st); err == nil {
		ch <- prometheus.MustNewConstMetric(descCheckpointFree, prometheus.GaugeValue, float64(st.Bavail)*float64(st.Bsize))
	}

	usage, hasUsage := usageProbeOf(m.rt)
	limits, hasLimits := limitProbeOf(m.rt)
	ctx, cancel := context.WithTimeout(m.ctx, scrapeTimeout)
	defer cancel()
	for _, r := range running {
		if r.memLimit > 0 {
			ch <- prometheus.MustNewConstMetric(descSandboxMemoryLimit, prometheus.GaugeValue, float64(r.memLimit), r.id, r.pool)
		}
		if hasUsage {
			// A sandbox gone since the list has no series: nothing to report.
			if u, err := usage.Usage(ctx, r.id); err == nil {
				ch <- prometheus.MustNewConstMetric(descSandboxCPU, prometheus.CounterValue, u.CPUSeconds, r.id, r.pool)
				ch <- prometheus.MustNewConstMetric(descSandboxMemory, prometheus.GaugeValue, float64(u.MemoryBytes), r.id, r.pool)
			}
		}
		if hasLimits {
			if h, err := limits.LimitHits(ctx, r.id); err == nil && h.DiskLimit > 0 {
				ch <- prometheus.MustNewConstMetric(descSandboxDisk, prometheus.GaugeValue, float64(h.DiskUsed), r.id, r.pool)
			}
		}
	}
}

func usageProbeOf(rt runtime.Runtime) (runtime.UsageProbe, bool) {
	if u, ok := rt.(interface{ Unwrap() runtime.Runtime }); ok {
		rt = u.Unwrap()
	}
	p, ok := rt.(runtime.UsageProbe)
	return p, ok
}
