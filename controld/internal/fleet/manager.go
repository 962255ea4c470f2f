package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/health"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// Labels controld puts on every container it creates, so reconciliation can
// tell its own containers from anything else in the namespace.
const (
	LabelManaged   = "forkfleet.dev/managed"
	LabelSandboxID = "forkfleet.dev/sandbox-id"
	managedValue   = "controld"
)

// Options configure a Manager.
type Options struct {
	Runtime runtime.Runtime // required
	Dialer  GuestDialer     // required
	Store   *store.Store
	Metrics *Metrics     // nil: fresh, unregistered instruments
	Tracer  trace.Tracer // nil: no traces
	Logger  *slog.Logger // nil: slog.Default()

	Host          string // reported in Sandbox.host
	GatewayHost   string // host:port of the ACI gateway, for endpoint URLs
	GatewayTLS    bool   // the gateway serves TLS: endpoint URLs say wss://
	DefaultImage  string
	DefaultScreen *controldv1.Screen
	CheckpointDir string
	BootTimeout   time.Duration // request to usable; 60 s when 0
	// LazyMinBytes is the least memory a checkpoint's lazy restore must
	// leave to the page server for a fork in mode AUTO to restore lazily;
	// 0: AUTO restores eagerly.
	LazyMinBytes int64

	ReapInterval time.Duration // TTL reaper period; 1 s when 0
	WatchBuffer  int           // events buffered per watcher; 1024 when 0
	PoolRetry    time.Duration // first pool refill retry delay; 500 ms when 0
	// DropConnections, when set, closes controld's own connections into a
	// sandbox (the ACI gateway's) right before it is frozen for a
	// checkpoint.
	DropConnections func(sandboxID string)
	// FrameSettle is how long the screen must be still for a pixel proof;
	// 150 ms when 0.
	FrameSettle time.Duration
	// WarmSlots is how many sandboxes of the default image, screen and
	// resources are kept precreated (created, not started) so a matching
	// create only starts one; 0 disables. Needs a runtime implementing
	// Precreator.
	WarmSlots int
	// WarmSlotMaxAge is how long a slot waits before it is recycled; 10 min
	// when 0.
	WarmSlotMaxAge time.Duration
	// Limits are the host's sandbox limits: per-sandbox defaults and
	// maxima, and admission (limits.Default() when its Default is nil).
	Limits limits.Host
	// LimitPoll is how often the kernel's limit counters of running
	// sandboxes are read (a runtime implementing LimitProbe); 1 s when 0.
	LimitPoll time.Duration
	// Health is where the background loops report progress and the
	// manager's own checks live (nil: a private checker).
	Health *health.Checker
	// Recordings records sandboxes (nil: the recording RPCs fail
	// FAILED_PRECONDITION).
	Recordings Recordings
}

// loopBound is how long a background loop may go without progress before
// controld counts as not alive (the systemd watchdog then restarts it): far
// above any loop's period, below the unit's WatchdogSec.
const loopBound = 20 * time.Second

// Manager owns sandboxes, checkpoints and pools: their records, their
// lifecycle and the background work (readiness waits, TTL reaper, exit
// watcher, pool replenishers). Safe for concurrent use. It is the API the
// gRPC handlers call, a facade: each concern is a type of its own over the
// same registry (doc.go lists them), embedded here so its RPCs are
// Manager's methods.
type Manager struct {
	*registry
	*sandboxer
	*warmer
	*pooler
	*checkpointer
	*forker

	// verifier runs the proofs that a fork is its checkpoint (verify.go).
	verifier *verifier
	// transfer moves checkpoints in and out of this host
	// (checkpoint_transfer.go).
	transfer *transfer
}

// registry is the one set of records every concern works over: the
// sandbox, checkpoint and pool tables and the lock that guards them, the
// store they persist to and the watchers their changes are published to,
// with what every concern shares (runtime, guest dialer, telemetry, the
// background work Close waits for). Records change through its update and
// touch only.
type registry struct {
	opts    Options
	rt      runtime.Runtime
	dialer  GuestDialer
	st      *store.Store
	metrics *Metrics
	tracer  trace.Tracer
	log     *slog.Logger

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu          sync.Mutex
	closed      bool
	sandboxes   map[string]*sandbox
	checkpoints map[string]*store.CheckpointRecord
	pools       map[string]*pool
	// tombstones remember recently deleted sandbox ids, so a retried delete
	// (say, after a lost response) succeeds instead of failing NotFound.
	tombstones map[string]time.Time
	ckMu       sync.Mutex // serializes checkpoint tree edits (create, delete, import)
	// claims are the pool claims in flight, of every pool: refills of
	// every kind (pool members, an image pool's checkpoint, boot and fork
	// slots) wait until they have been quiet for poolQuiet
	// (pool_claim.go), since on a host of a few cores a refill's restore,
	// boot or precreate takes the CPU a claim burst and its clients' first
	// requests need.
	claims gate
	// requests makes the creating calls idempotent by request id: their
	// responses in the store, what they created tagged with the id.
	requests rules.Dedup
	// requestSweep is when expired request ids were last forgotten.
	requestSweep time.Time

	wmu           sync.Mutex
	watchers      map[*Watch]struct{}
	watchesClosed bool
}

// sandbox is the manager's in-memory view of one sandbox.
type sandbox struct {
	rec *store.SandboxRecord // guarded by Manager.mu

	// op serializes whole-sandbox operations (delete, suspend, resume,
	// checkpoint, claim).
	op sync.Mutex
	// persist orders record writes of this sandbox.
	persist sync.Mutex

	// started is closed once the runtime call that creates the sandbox has
	// returned (success or not); settled once it is READY or failed.
	started, settled chan struct{}
	// workDone is closed when the goroutine booting it has exited.
	workDone   chan struct{}
	cancelWork context.CancelFunc
	startErr   error // set before started closes
	deleting   bool  // guarded by Manager.mu
	claimed    bool  // guarded by Manager.mu: taken by a claim in progress
	// fromSlot: the sandbox took a warm slot (set at registration, before
	// its boot starts; never changed after).
	fromSlot bool
	// checkpointing: guarded by Manager.mu; the gateway refuses new
	// connections meanwhile (they would break the dump).
	checkpointing bool
	// build is the manifest digest of the image build it runs, as the
	// runtime reports it ("" unknown); guarded by Manager.mu.
	build string
}

// imageDigestNow is the manifest digest image name ref names now ("" when
// the runtime cannot tell, or there is no such image).
func (r *registry) imageDigestNow(ctx context.Context, ref string) string {
	res, ok := runtime.As[runtime.ImageResolver](r.rt)
	if !ok {
		return ""
	}
	dg, err := res.ImageDigest(ctx, ref)
	if err != nil {
		r.log.Debug("image digest unknown", "image", ref, "err", err)
		return ""
	}
	return dg
}

// New loads the store, reconciles it with the runtime and starts the
// background loops. Close stops them; sandboxes keep running.
func New(ctx context.Context, opts Options) (*Manager, error) {
	if opts.Runtime == nil || opts.Dialer == nil || opts.Store == nil {
		return nil, errors.New("fleet: Runtime, Dialer and Store are required")
	}
	if opts.CheckpointDir == "" || opts.DefaultImage == "" || opts.GatewayHost == "" {
		return nil, errors.New("fleet: CheckpointDir, DefaultImage and GatewayHost are required")
	}
	if opts.DefaultScreen == nil {
		opts.DefaultScreen = &controldv1.Screen{Width: 1280, Height: 800, Depth: 24}
	}
	if opts.BootTimeout <= 0 {
		opts.BootTimeout = 60 * time.Second
	}
	if opts.ReapInterval <= 0 {
		opts.ReapInterval = time.Second
	}
	if opts.WatchBuffer <= 0 {
		opts.WatchBuffer = 1024
	}
	if opts.PoolRetry <= 0 {
		opts.PoolRetry = 500 * time.Millisecond
	}
	if opts.FrameSettle <= 0 {
		opts.FrameSettle = 150 * time.Millisecond
	}
	if opts.WarmSlots < 0 {
		return nil, errors.New("fleet: WarmSlots must not be negative")
	}
	if opts.WarmSlotMaxAge <= 0 {
		opts.WarmSlotMaxAge = defaultSlotMaxAge
	}
	if opts.LimitPoll <= 0 {
		opts.LimitPoll = defaultLimitPoll
	}
	if opts.Limits.Default == nil {
		opts.Limits = limits.Default()
	}
	if err := opts.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.Tracer == nil {
		opts.Tracer = noop.NewTracerProvider().Tracer("controld")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Health == nil {
		opts.Health = health.New()
	}
	if opts.Host == "" {
		opts.Host, _ = os.Hostname()
	}
	if err := os.MkdirAll(opts.CheckpointDir, 0o700); err != nil {
		return nil, fmt.Errorf("fleet: checkpoint dir: %w", err)
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &registry{
		opts: opts, rt: opts.Runtime, dialer: opts.Dialer, st: opts.Store,
		metrics: opts.Metrics, tracer: opts.Tracer, log: opts.Logger,
		ctx: mctx, cancel: cancel,
		sandboxes:   map[string]*sandbox{},
		checkpoints: map[string]*store.CheckpointRecord{},
		pools:       map[string]*pool{},
		tombstones:  map[string]time.Time{},
		watchers:    map[*Watch]struct{}{},
		requests:    rules.Dedup{Store: opts.Store},
	}
	// The concerns, each over the registry and holding the others it
	// calls (concerns_test.go keeps the table).
	s := &sandboxer{registry: r}
	w := &warmer{registry: r, sandboxer: s}
	p := &pooler{registry: r, sandboxer: s}
	c := &checkpointer{registry: r, warmer: w, pooler: p}
	t := &transfer{m: c}
	f := &forker{registry: r, verifier: &verifier{registry: r}, transfer: t, sandboxer: s, warmer: w}
	s.warmer, s.pooler = w, p
	p.checkpointer, p.forker = c, f
	m := &Manager{registry: r, sandboxer: s, warmer: w, pooler: p, checkpointer: c, forker: f, verifier: f.verifier, transfer: t}
	// Subscribe to exits before reconciling so none is lost in between.
	exits, err := m.rt.Exits(mctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("fleet: runtime exits: %w", err)
	}
	if err := m.reconcile(ctx); err != nil {
		cancel()
		return nil, err
	}
	// The manager's lock guards every record: held for long, every RPC
	// waits behind it.
	opts.Health.AddCheck("manager lock", func(ctx context.Context) error {
		locked := make(chan struct{})
		go func() { m.mu.Lock(); m.mu.Unlock(); close(locked) }()
		select {
		case <-locked:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("held past the check's deadline: %w", ctx.Err())
		}
	})
	m.goBackground(func() { m.watchExits(exits) })
	m.goBackground(m.reapLoop)
	if probe, ok := limitProbeOf(m.rt); ok {
		m.goBackground(func() { m.watchLimits(probe) })
	}
	// After reconciliation: it deletes a crashed controld's slots (containers
	// without records), which must not include the new ones.
	m.startSlots()
	m.mu.Lock()
	for _, p := range m.pools {
		m.startPoolLocked(p)
	}
	m.mu.Unlock()
	return m, nil
}

// goBackground runs fn as tracked background work; after Close it refuses
// (false), so Close's wait is never raced by a late Add.
func (m *registry) goBackground(fn func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.goBackgroundLocked(fn)
}

func (m *registry) goBackgroundLocked(fn func()) bool {
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
	return true
}

// Close stops background work (replenishers, reaper, readiness waits) and
// ends every watch. It does not touch running sandboxes: a restarted
// controld reconciles and adopts them. Close waits for in-flight work until
// ctx ends.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	m.CloseWatches()
	select {
	case <-done:
		m.requests.Wait() // answers of request ids still being stored
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fleet: background work still running at shutdown deadline: %w", ctx.Err())
	}
}

func (m *registry) checkOpenErr() error {
	return errdefs.WithReason(errdefs.ErrUnavailable, "SHUTTING_DOWN", "controld is shutting down")
}

func (m *registry) checkOpen() error {
	if m.closed {
		return errdefs.WithReason(errdefs.ErrUnavailable, "SHUTTING_DOWN", "controld is shutting down")
	}
	return nil
}

// sandboxNotFound is the error for an unknown sandbox id.
func sandboxNotFound(id string) error {
	return errdefs.WithReason(errdefs.ErrNotFound, "SANDBOX_NOT_FOUND", "sandbox %s not found", id)
}

func checkpointNotFound(id string) error {
	return errdefs.WithReason(errdefs.ErrNotFound, "CHECKPOINT_NOT_FOUND", "checkpoint %s not found", id)
}

func poolNotFound(id string) error {
	return errdefs.WithReason(errdefs.ErrNotFound, "POOL_NOT_FOUND", "pool %s not found", id)
}

// lookup returns a live sandbox (not being deleted).
func (m *registry) lookup(id string) (*sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok || sb.deleting {
		return nil, sandboxNotFound(id)
	}
	return sb, nil
}

// snapshot returns a copy of sb's public record.
func (m *registry) snapshot(sb *sandbox) *controldv1.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return proto.Clone(sb.rec.Sandbox).(*controldv1.Sandbox)
}

// update mutates sb's record under the lock, writes it durably and then
// publishes ev (when not UNSPECIFIED). Writes of one sandbox land in order.
func (m *registry) update(sb *sandbox, ev controldv1.SandboxEventType, phase *controldv1.BootPhase, fn func(r *store.SandboxRecord)) (*controldv1.Sandbox, error) {
	return m.change(sb, true, ev, phase, fn)
}

// touch is update without the durable write, for changes the next state
// change persists anyway (boot phases): each write is an fsync on the boot
// path.
func (m *registry) touch(sb *sandbox, ev controldv1.SandboxEventType, phase *controldv1.BootPhase, fn func(r *store.SandboxRecord)) {
	m.change(sb, false, ev, phase, fn)
}

func (m *registry) change(sb *sandbox, durable bool, ev controldv1.SandboxEventType, phase *controldv1.BootPhase, fn func(r *store.SandboxRecord)) (*controldv1.Sandbox, error) {
	sb.persist.Lock()
	defer sb.persist.Unlock()
	m.mu.Lock()
	if fn != nil {
		fn(sb.rec)
	}
	snap := cloneRecord(sb.rec)
	m.refreshStateGaugeLocked()
	m.mu.Unlock()
	if durable {
		if err := m.st.PutSandbox(snap); err != nil {
			return nil, fmt.Errorf("sandbox %s: persist: %w", snap.Sandbox.GetId(), err)
		}
	}
	if ev != controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_UNSPECIFIED {
		m.publish(&controldv1.WatchSandboxesResponse{Type: ev, Sandbox: snap.Sandbox, Phase: phase})
	}
	return proto.Clone(snap.Sandbox).(*controldv1.Sandbox), nil
}

func cloneRecord(r *store.SandboxRecord) *store.SandboxRecord {
	c := *r
	c.Sandbox = proto.Clone(r.Sandbox).(*controldv1.Sandbox)
	return &c
}

func (m *registry) refreshStateGaugeLocked() {
	counts := map[controldv1.SandboxState]int{}
	for _, sb := range m.sandboxes {
		counts[sb.rec.Sandbox.GetState()]++
	}
	for v, name := range controldv1.SandboxState_name {
		if v == 0 {
			continue
		}
		m.metrics.SandboxesByState.WithLabelValues(name).Set(float64(counts[controldv1.SandboxState(v)]))
	}
}

func (m *sandboxer) endpoint(sb *sandbox) *controldv1.Endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.endpointLocked(sb)
}

func (m *sandboxer) endpointLocked(sb *sandbox) *controldv1.Endpoint {
	scheme := "ws"
	if m.opts.GatewayTLS {
		scheme = "wss"
	}
	ep := &controldv1.Endpoint{
		Url:          fmt.Sprintf("%s://%s/v1/sandboxes/%s/aci", scheme, m.opts.GatewayHost, sb.rec.Sandbox.GetId()),
		Token:        sb.rec.ACIToken,
		UnixPath:     sb.rec.ACISocket.String(),
		UnixPidStart: sb.rec.ACISocket.Start,
	}
	// A recorded sandbox's agents go through the gateway, where every
	// request is read for the trajectory (guestd's socket bypasses it).
	if m.recording(sb.rec.Sandbox.GetId()) {
		ep.UnixPath, ep.UnixPidStart = "", 0
	}
	return ep
}

// Route is what the ACI gateway needs to forward a connection.
type Route struct {
	Token     string
	ACISocket guestsock.Addr
}

// Route returns the current ACI token and guestd socket of a sandbox, for
// the gateway. Only sandboxes whose guestd may be reachable are routed.
// When the sandbox exists but cannot be routed now, the error says why and
// the Route still carries its Token (nothing else), so the gateway checks
// the caller's token before it reveals the state; for an unknown (or
// pooled, unclaimed) sandbox the Route is empty.
func (m *sandboxer) Route(id string) (Route, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok || sb.deleting || sb.rec.Pooled {
		return Route{}, sandboxNotFound(id)
	}
	auth := Route{Token: sb.rec.ACIToken}
	if sb.checkpointing {
		return auth, errdefs.WithReason(errdefs.ErrUnavailable, "SANDBOX_CHECKPOINTING",
			"sandbox %s is being checkpointed; retry shortly", id)
	}
	switch sb.rec.Sandbox.GetState() {
	case controldv1.SandboxState_SANDBOX_STATE_BOOTING, controldv1.SandboxState_SANDBOX_STATE_READY,
		controldv1.SandboxState_SANDBOX_STATE_SUSPENDED:
	default:
		return auth, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_NOT_RUNNING",
			"sandbox %s is %s", id, sb.rec.Sandbox.GetState())
	}
	if sb.rec.ACISocket.IsZero() {
		return auth, errdefs.WithReason(errdefs.ErrUnavailable, "SANDBOX_STARTING", "sandbox %s has no guestd socket yet", id)
	}
	return Route{Token: sb.rec.ACIToken, ACISocket: sb.rec.ACISocket}, nil
}

// dialGuest connects to guestd, retrying every 2 ms while its socket is not
// there yet, until ctx ends.
func (m *registry) dialGuest(ctx context.Context, path guestsock.Addr, token string) (Guest, error) {
	if path.IsZero() {
		return nil, errdefs.WithReason(errdefs.ErrUnavailable, "GUEST_UNREACHABLE", "no guestd socket known")
	}
	var t *time.Timer
	for {
		g, err := m.dialer.DialGuest(ctx, path, token)
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, errdefs.ErrUnavailable) {
			return nil, fmt.Errorf("guestd at %s: %w", path, err)
		}
		if t == nil {
			t = time.NewTimer(2 * time.Millisecond)
			defer t.Stop()
		} else {
			t.Reset(2 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return nil, errdefs.WithReason(errdefs.ErrDeadlineExceeded, "GUEST_UNREACHABLE",
				"guestd at %s did not accept a session in time: %v", path, err)
		case <-t.C:
		}
	}
}
