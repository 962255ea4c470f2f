package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/controld/internal/health"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// Limits reached: the kernel enforces a sandbox's limits by itself (an OOM
// kill, a refused fork, EDQUOT); the manager reads its counters every
// Options.LimitPoll and reports them in Sandbox.limits_reached, with a
// SANDBOX_EVENT_TYPE_LIMIT event per change. Nothing is stopped beyond
// what the kernel stopped: a sandbox at its disk quota keeps running, and
// its writes fail until it frees space.

const defaultLimitPoll = time.Second

func limitProbeOf(rt runtime.Runtime) (runtime.LimitProbe, bool) {
	if u, ok := rt.(interface{ Unwrap() runtime.Runtime }); ok {
		rt = u.Unwrap()
	}
	p, ok := rt.(runtime.LimitProbe)
	return p, ok
}

// watchLimits polls the limit counters of running sandboxes until Close.
func (m *sandboxer) watchLimits(probe runtime.LimitProbe) {
	alive := m.opts.Health.Loop("limit poller", max(loopBound, 10*m.opts.LimitPoll))
	defer alive.Done()
	t := time.NewTicker(m.opts.LimitPoll)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			m.pollLimits(probe, alive)
			alive.Beat()
		}
	}
}

func (m *sandboxer) pollLimits(probe runtime.LimitProbe, alive *health.Loop) {
	m.mu.Lock()
	var running []*sandbox
	for _, sb := range m.sandboxes {
		switch sb.rec.Sandbox.GetState() {
		case controldv1.SandboxState_SANDBOX_STATE_BOOTING, controldv1.SandboxState_SANDBOX_STATE_READY:
			// Frozen sandboxes run nothing that could reach a limit.
			if !sb.deleting && !sb.rec.Pooled {
				running = append(running, sb)
			}
		}
	}
	m.mu.Unlock()
	for _, sb := range running {
		if m.ctx.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
		h, err := probe.LimitHits(ctx, sb.rec.Sandbox.GetId())
		cancel()
		if err != nil {
			if !errors.Is(err, errdefs.ErrNotFound) {
				m.log.Debug("read limit counters", "sandbox", sb.rec.Sandbox.GetId(), "err", err)
			}
			continue
		}
		m.noteLimits(sb, h)
		alive.Beat()
	}
}

// noteLimits records what h says against sb's record, publishing a LIMIT
// event when it changes anything.
func (m *sandboxer) noteLimits(sb *sandbox, h runtime.LimitHits) {
	m.mu.Lock()
	res := sb.rec.Sandbox.GetResources()
	old := sb.rec.Sandbox.GetLimitsReached()
	m.mu.Unlock()
	now := timestamppb.Now()
	next := make([]*controldv1.LimitReached, 0, 3)
	changed := false
	note := func(limit controldv1.SandboxLimit, count uint64, msg string) {
		var prev *controldv1.LimitReached
		for _, e := range old {
			if e.GetLimit() == limit {
				prev = e
			}
		}
		switch {
		case prev == nil && count == 0:
			return
		case prev != nil && prev.GetCount() == count:
			next = append(next, prev)
			return
		}
		e := &controldv1.LimitReached{Limit: limit, Count: count, FirstAt: now, LastAt: now, Message: msg}
		if prev != nil {
			e.FirstAt = prev.GetFirstAt()
			if limit != controldv1.SandboxLimit_SANDBOX_LIMIT_DISK && count > prev.GetCount() {
				m.metrics.LimitHits.WithLabelValues(limitName(limit)).Add(float64(count - prev.GetCount()))
			}
		} else if limit != controldv1.SandboxLimit_SANDBOX_LIMIT_DISK {
			m.metrics.LimitHits.WithLabelValues(limitName(limit)).Add(float64(count))
		}
		if limit == controldv1.SandboxLimit_SANDBOX_LIMIT_DISK && count > 0 {
			m.metrics.LimitHits.WithLabelValues(limitName(limit)).Inc()
		}
		next = append(next, e)
		changed = true
	}
	note(controldv1.SandboxLimit_SANDBOX_LIMIT_MEMORY, h.OOMKills,
		fmt.Sprintf("the kernel killed %d process(es) of the sandbox at its memory limit of %s", h.OOMKills, limits.Bytes(res.GetMemoryBytes())))
	note(controldv1.SandboxLimit_SANDBOX_LIMIT_PIDS, h.PidsRefused,
		fmt.Sprintf("%d fork(s) refused at the limit of %d processes and threads", h.PidsRefused, res.GetPidsMax()))
	full := uint64(0)
	msg := fmt.Sprintf("disk no longer full: %s of %s used", limits.Bytes(h.DiskUsed), limits.Bytes(h.DiskLimit))
	if h.DiskFull() {
		full = 1
		msg = fmt.Sprintf("disk full: %s of %s used; writes fail with EDQUOT (Disk quota exceeded) until the sandbox frees space",
			limits.Bytes(h.DiskUsed), limits.Bytes(h.DiskLimit))
	}
	note(controldv1.SandboxLimit_SANDBOX_LIMIT_DISK, full, msg)
	if !changed {
		return
	}
	id := sb.rec.Sandbox.GetId()
	for _, e := range next {
		if e.GetLastAt() == now {
			m.log.Info("sandbox limit", "sandbox", id, "limit", limitName(e.GetLimit()), "count", e.GetCount(), "detail", e.GetMessage())
		}
	}
	if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_LIMIT, nil, func(r *store.SandboxRecord) {
		r.Sandbox.LimitsReached = next
	}); err != nil {
		m.log.Error("persist limits reached", "sandbox", id, "err", err)
	}
}

// limitsOnExit reads the limit counters of a sandbox whose task exited and
// says why when the memory limit killed it.
func (m *sandboxer) limitsOnExit(sb *sandbox) string {
	probe, ok := limitProbeOf(m.rt)
	if !ok {
		return ""
	}
	ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
	defer cancel()
	h, err := probe.LimitHits(ctx, sb.rec.Sandbox.GetId())
	if err != nil {
		return ""
	}
	m.noteLimits(sb, h)
	if h.OOMKills == 0 {
		return ""
	}
	m.mu.Lock()
	mem := proto.Clone(sb.rec.Sandbox.GetResources()).(*controldv1.Resources).GetMemoryBytes()
	m.mu.Unlock()
	return fmt.Sprintf("; the kernel killed %d process(es) at the memory limit of %s (memory_bytes)", h.OOMKills, limits.Bytes(mem))
}

func limitName(l controldv1.SandboxLimit) string {
	switch l {
	case controldv1.SandboxLimit_SANDBOX_LIMIT_MEMORY:
		return "memory"
	case controldv1.SandboxLimit_SANDBOX_LIMIT_PIDS:
		return "pids"
	case controldv1.SandboxLimit_SANDBOX_LIMIT_DISK:
		return "disk"
	}
	return "unknown"
}
