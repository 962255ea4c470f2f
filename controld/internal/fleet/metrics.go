package fleet

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Metrics are the manager's Prometheus instruments.
type Metrics struct {
	SandboxesByState *prometheus.GaugeVec
	BootPhase        *prometheus.HistogramVec
	RuntimeCall      *prometheus.HistogramVec
	CheckpointStep   *prometheus.HistogramVec
	CheckpointTotal  *prometheus.HistogramVec
	CheckpointFrozen *prometheus.HistogramVec
	CheckpointBytes  *prometheus.HistogramVec
	Forks            *prometheus.CounterVec
	ForkReplica      prometheus.Histogram
	PoolSize         *prometheus.GaugeVec
	PoolAvailable    *prometheus.GaugeVec
	PoolClaims       *prometheus.CounterVec
	ClaimLatency     *prometheus.HistogramVec
	WatchDropped     prometheus.Counter
	BootSlots        *prometheus.CounterVec
	WarmSlots        prometheus.Gauge
	Admission        prometheus.Counter
	LimitHits        *prometheus.CounterVec
	RegistryBytes    *prometheus.CounterVec
	RegistryTransfer *prometheus.HistogramVec
	RemoteForks      *prometheus.CounterVec
}

// Millisecond-resolution buckets from 1 ms to about 65 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)

// NewMetrics creates the instruments and registers them with reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		SandboxesByState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "sandboxes",
			Help: "Sandboxes by state.",
		}, []string{"state"}),
		BootPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "boot_phase_seconds",
			Help: "Time from the create request to each boot milestone.", Buckets: latencyBuckets,
		}, []string{"phase", "kind"}),
		RuntimeCall: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "runtime_call_seconds",
			Help: "Runtime (containerd) call latency.", Buckets: latencyBuckets,
		}, []string{"op", "code"}),
		CheckpointStep: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "checkpoint_step_seconds",
			Help: "Checkpoint steps by step (dump: CRIU; layer: the writable layer's copy) and tier; checkpoint_seconds has the whole.", Buckets: latencyBuckets,
		}, []string{"step", "tier"}),
		CheckpointTotal: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "checkpoint_seconds",
			Help: "CreateCheckpoint from request to committed record, by tier.", Buckets: latencyBuckets,
		}, []string{"tier"}),
		CheckpointFrozen: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "checkpoint_frozen_seconds",
			Help: "How long a checkpoint's source was frozen, by tier.", Buckets: latencyBuckets,
		}, []string{"tier"}),
		CheckpointBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "checkpoint_bytes",
			Help: "Size of each checkpoint taken, by tier and part (memory: CRIU's images; layer: the writable layer).",
			// 1 MiB to 64 GiB.
			Buckets: prometheus.ExponentialBuckets(1<<20, 4, 9),
		}, []string{"tier", "part"}),
		Forks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "fork_replicas_total",
			Help: "Fork replicas by outcome (a gRPC code name).",
		}, []string{"code"}),
		ForkReplica: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "fork_replica_seconds",
			Help: "Fork request to usable, verified replica.", Buckets: latencyBuckets,
		}),
		PoolSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "pool_size",
			Help: "Target size of each pool.",
		}, []string{"pool"}),
		PoolAvailable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "pool_available",
			Help: "Warm sandboxes ready to claim.",
		}, []string{"pool"}),
		PoolClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "pool_claims_total",
			Help: "Pool claims by pool and result (hit, miss, error); a deleted pool's series go with it.",
		}, []string{"pool", "result"}),
		ClaimLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "pool_claim_seconds",
			Help: "Claim request to usable sandbox.", Buckets: latencyBuckets,
		}, []string{"result"}),
		WatchDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "watch_dropped_total",
			Help: "Watch streams closed because the client fell behind.",
		}),
		BootSlots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "boot_warm_slot_total",
			Help: "Cold boots by warm-slot outcome (hit, empty: none ready, mismatch: spec differs from the slots').",
		}, []string{"result"}),
		WarmSlots: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "warm_slots",
			Help: "Precreated sandboxes ready to be started by a matching create.",
		}),
		Admission: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "admission_refused_total",
			Help: "Sandboxes (creates, replicas, pool fills) refused because the host was at its admission limits.",
		}),
		LimitHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "limit_hits_total",
			Help: "Times sandboxes ran into a limit, by limit (memory: OOM kills, pids: refused forks, disk: disk found full).",
		}, []string{"limit"}),
		RegistryBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "registry_bytes_total",
			Help: "Checkpoint image bytes sent to (push) and fetched from (pull) OCI registries.",
		}, []string{"direction"}),
		RegistryTransfer: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "registry_transfer_seconds",
			Help: "Checkpoint pushes and pulls (a fork's included), by direction and outcome (a gRPC code name).", Buckets: latencyBuckets,
		}, []string{"direction", "code"}),
		RemoteForks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "remote_checkpoint_total",
			Help: "Forks of a registry reference by how the checkpoint was found (cached: an earlier import; pulled: pulled and imported for it; shared: another fork's pull).",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.SandboxesByState, m.BootPhase, m.RuntimeCall, m.CheckpointStep, m.CheckpointTotal,
			m.CheckpointFrozen, m.CheckpointBytes, m.Forks,
			m.ForkReplica, m.PoolSize, m.PoolAvailable, m.PoolClaims, m.ClaimLatency, m.WatchDropped,
			m.BootSlots, m.WarmSlots, m.Admission, m.LimitHits, m.RegistryBytes, m.RegistryTransfer, m.RemoteForks)
	}
	return m
}

// InstrumentRuntime wraps rt so every call's latency lands in
// m.RuntimeCall. The wrapper forwards CheckpointExporter when rt has it.
func InstrumentRuntime(rt runtime.Runtime, m *Metrics) runtime.Runtime {
	return &instrumented{rt: rt, m: m}
}

type instrumented struct {
	rt runtime.Runtime
	m  *Metrics
}

// Unwrap returns the wrapped runtime (the manager looks through it for
// optional interfaces).
func (r *instrumented) Unwrap() runtime.Runtime { return r.rt }

// track starts timing op; call the result with the call's error at the end.
func (r *instrumented) track(op string) func(*error) {
	start := time.Now()
	return func(err *error) {
		r.m.RuntimeCall.WithLabelValues(op, errgrpc.Code(*err).String()).Observe(time.Since(start).Seconds())
	}
}

func (r *instrumented) Boot(ctx context.Context, spec runtime.BootSpec) (inst runtime.Instance, err error) {
	defer r.track("boot")(&err)
	return r.rt.Boot(ctx, spec)
}

func (r *instrumented) Restore(ctx context.Context, spec runtime.BootSpec, from runtime.CheckpointRef) (inst runtime.Instance, err error) {
	defer r.track("restore")(&err)
	return r.rt.Restore(ctx, spec, from)
}

func (r *instrumented) Delete(ctx context.Context, id string) (err error) {
	defer r.track("delete")(&err)
	return r.rt.Delete(ctx, id)
}

func (r *instrumented) List(ctx context.Context) (out []runtime.Instance, err error) {
	defer r.track("list")(&err)
	return r.rt.List(ctx)
}

func (r *instrumented) Freeze(ctx context.Context, id string) (err error) {
	defer r.track("freeze")(&err)
	return r.rt.Freeze(ctx, id)
}

func (r *instrumented) Thaw(ctx context.Context, id string) (err error) {
	defer r.track("thaw")(&err)
	return r.rt.Thaw(ctx, id)
}

func (r *instrumented) Checkpoint(ctx context.Context, id string, spec runtime.CheckpointSpec) (res runtime.CheckpointResult, err error) {
	defer r.track("checkpoint")(&err)
	return r.rt.Checkpoint(ctx, id, spec)
}

func (r *instrumented) DeleteCheckpoint(ctx context.Context, ref runtime.CheckpointRef) (err error) {
	defer r.track("delete_checkpoint")(&err)
	return r.rt.DeleteCheckpoint(ctx, ref)
}

func (r *instrumented) Exits(ctx context.Context) (<-chan runtime.Exit, error) {
	return r.rt.Exits(ctx)
}
