// Package controldfake is an in-memory controld: the four gRPC services of
// forkfleet.controld.v1 with controld's validation rules, error codes and
// details (BadRequest naming the field, ErrorInfo reasons), lifecycle
// events, checkpoint lineage, per-replica fork results and pools with hit
// and miss accounting. No containers run: sandboxes are records. Tests of
// ACI traffic point the sandboxes' endpoints at a real ACI server with
// SetEndpoint.
package controldfake

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/api/netpolicy"
	"github.com/forkfleet/forkfleet/api/rules"
)

// DefaultImage is the image CreateSandbox uses when none is given; it is
// known to a new Fake.
const DefaultImage = "localhost/forkfleet/desktop:latest"

// Fake implements controldv1.SandboxServiceServer, CheckpointServiceServer,
// PoolServiceServer and HostServiceServer. Its exported fields configure behavior; set them
// before serving.
type Fake struct {
	controldv1.UnimplementedSandboxServiceServer
	controldv1.UnimplementedCheckpointServiceServer
	controldv1.UnimplementedPoolServiceServer
	controldv1.UnimplementedHostServiceServer

	// Host is the host name the fake reports (GetHostStatus) and puts in
	// its records' host fields; "fake" when empty. Fakes standing in for
	// the hosts of one fleet take distinct names.
	Host string
	// MemoryTotalBytes is the host RAM GetHostStatus reports
	// (Limits.MaxMemoryBytes when 0); memory_available_bytes is what the
	// admitted sandboxes leave of it.
	MemoryTotalBytes int64
	// Registry is the OCI registry ExportCheckpoint pushes to and forks and
	// imports pull from: fakes standing in for the hosts of one fleet share
	// one (NewRegistry); a private one when nil.
	Registry *Registry
	// Token, when set, is required as a bearer credential on every RPC.
	Token string
	// BootDelay: a sandbox created without wait_ready stays BOOTING this
	// long (0: ready at once).
	BootDelay time.Duration
	// RefillDelay: a warm slot taken by a claim comes back after this long
	// (0: at once; negative: never).
	RefillDelay time.Duration
	// FailReplica, when set, decides the fate of replica i of a fork: a
	// non-nil error (an errdefs class) fails that replica alone.
	FailReplica func(checkpointID string, i int) error
	// Limits are the host's sandbox limits and admission, as controld's
	// (limits.Default() when Limits.Default is nil). Pool members are not
	// modelled: a pool hit is admitted as controld admits a claim of a warm
	// sandbox, a miss as a new sandbox.
	Limits limits.Host

	mu          sync.Mutex
	recordings  map[string]*controldv1.Recording // recording.go
	images      map[string]bool
	sandboxes   map[string]*controldv1.Sandbox
	checkpoints map[string]*controldv1.Checkpoint
	exported    map[string]*controldv1.Checkpoint // reference -> the checkpoint as exported (an image outlives it)
	pulled      map[string]string                 // pushed reference -> its import here (ForkCheckpoint's cache)
	pools       map[string]*controldv1.Pool
	poolCks     map[string]string // image pool id -> its own checkpoint (pool_checkpoint.go's rules)
	retiredCks  map[string]bool   // pool checkpoints whose pool is gone, deleted with their last fork
	watchers    map[*watcher]struct{}
	endpoint    func(*controldv1.Sandbox) *controldv1.Endpoint
	timers      map[*time.Timer]struct{}
	readyCh     map[string]chan struct{} // closed when the sandbox leaves BOOTING
	ports       map[string]string        // "sandbox/port" -> token (ExposePort)
	expiry      map[string]*time.Timer   // sandbox id -> its TTL
	dedup       rules.Dedup              // request ids
	requests    requestStore
	closed      bool
}

// New returns an empty Fake that knows DefaultImage.
func New() *Fake {
	f := &Fake{
		images:      map[string]bool{DefaultImage: true},
		sandboxes:   make(map[string]*controldv1.Sandbox),
		checkpoints: make(map[string]*controldv1.Checkpoint),
		exported:    make(map[string]*controldv1.Checkpoint),
		pulled:      make(map[string]string),
		pools:       make(map[string]*controldv1.Pool),
		poolCks:     make(map[string]string),
		retiredCks:  make(map[string]bool),
		watchers:    make(map[*watcher]struct{}),
		timers:      make(map[*time.Timer]struct{}),
		readyCh:     make(map[string]chan struct{}),
		expiry:      make(map[string]*time.Timer),
	}
	f.dedup.Store = &f.requests
	return f
}

// Register adds the four services to s.
func (f *Fake) Register(s *grpc.Server) {
	controldv1.RegisterSandboxServiceServer(s, f)
	controldv1.RegisterCheckpointServiceServer(s, f)
	controldv1.RegisterPoolServiceServer(s, f)
	controldv1.RegisterHostServiceServer(s, f)
}

// ServerOptions returns controld's keepalive and the interceptors
// enforcing Token.
func (f *Fake) ServerOptions() []grpc.ServerOption {
	return append(client.ServerKeepalive(),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := f.auth(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := f.auth(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	)
}

func (f *Fake) auth(ctx context.Context) error {
	if f.Token == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if v == "Bearer "+f.Token {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "missing or wrong bearer token")
}

// AddImage makes ref a known image.
func (f *Fake) AddImage(ref string) {
	f.mu.Lock()
	f.images[ref] = true
	f.mu.Unlock()
}

// SetEndpoint makes every sandbox's Endpoint come from fn (e.g. the URL of a
// real guestd or of an acitest server). The default is a gateway URL that
// does not resolve.
func (f *Fake) SetEndpoint(fn func(sb *controldv1.Sandbox) *controldv1.Endpoint) {
	f.mu.Lock()
	f.endpoint = fn
	f.mu.Unlock()
}

// SetState forces a sandbox's state (e.g. FAILED) and emits a STATE event.
func (f *Fake) SetState(id string, st controldv1.SandboxState, message string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[id]
	if !ok {
		return errdefs.WithReason(errdefs.ErrNotFound, "SANDBOX_NOT_FOUND", "sandbox %q not found", id)
	}
	sb.State = st
	sb.StatusMessage = message
	f.leaveBooting(id)
	f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, sb, nil)
	return nil
}

// ReachLimit reports sandbox id at one of its limits as controld does when
// the kernel enforced it: Sandbox.limits_reached gets (or updates) the
// limit's entry and a LIMIT event goes out.
func (f *Fake) ReachLimit(id string, limit controldv1.SandboxLimit, count uint64, message string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[id]
	if !ok {
		return errdefs.WithReason(errdefs.ErrNotFound, "SANDBOX_NOT_FOUND", "sandbox %q not found", id)
	}
	now := timestamppb.Now()
	e := &controldv1.LimitReached{Limit: limit, Count: count, FirstAt: now, LastAt: now, Message: message}
	i := slices.IndexFunc(sb.LimitsReached, func(r *controldv1.LimitReached) bool { return r.GetLimit() == limit })
	if i >= 0 {
		e.FirstAt = sb.LimitsReached[i].GetFirstAt()
		sb.LimitsReached[i] = e
	} else {
		sb.LimitsReached = append(sb.LimitsReached, e)
	}
	f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_LIMIT, sb, nil)
	return nil
}

// Close stops timers and ends watch streams.
func (f *Fake) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for t := range f.timers {
		t.Stop()
	}
	clear(f.timers)
	for w := range f.watchers {
		close(w.done)
	}
	clear(f.watchers)
}

func (f *Fake) after(d time.Duration, fn func()) *time.Timer {
	if f.closed {
		return nil
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.timers, t)
		if !f.closed {
			fn()
		}
	})
	f.timers[t] = struct{}{}
	return t
}

// expire deletes sandbox id after d (its TTL); the caller holds f.mu.
func (f *Fake) expire(id string, d time.Duration) {
	if t := f.expiry[id]; t != nil {
		t.Stop()
		delete(f.timers, t)
	}
	f.expiry[id] = f.after(d, func() {
		delete(f.expiry, id)
		f.deleteSandbox(id)
	})
}

// ---- validation: controld's rules (api/rules, api/limits, api/netpolicy)

// limits returns the host limits in force.
func (f *Fake) limits() limits.Host {
	if f.Limits.Default == nil {
		return limits.Default()
	}
	return f.Limits
}

// admit applies controld's admission to one more sandbox with res; the
// caller holds f.mu.
func (f *Fake) admit(res *controldv1.Resources) error {
	return f.limits().Admit(f.held(), limits.Of(res))
}

// held is what the fake's sandboxes hold against admission, counted as
// controld counts; the caller holds f.mu.
func (f *Fake) held() limits.Usage {
	var held limits.Usage
	for _, sb := range f.sandboxes {
		switch sb.GetState() {
		case controldv1.SandboxState_SANDBOX_STATE_FAILED, controldv1.SandboxState_SANDBOX_STATE_DELETED:
		case controldv1.SandboxState_SANDBOX_STATE_STOPPED:
			held.Sandboxes++
		default:
			held = held.Add(limits.Of(sb.GetResources()))
		}
	}
	return held
}

// host is the name in the fake's records and host status.
func (f *Fake) host() string {
	if f.Host == "" {
		return "fake"
	}
	return f.Host
}

// GetHostStatus reports the fake's host as controld does (limits.Host.Status
// for admission); its memory is MemoryTotalBytes less what is admitted.
func (f *Fake) GetHostStatus(ctx context.Context, req *controldv1.GetHostStatusRequest) (*controldv1.GetHostStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lim := f.limits()
	st := lim.Status(f.held())
	st.Host, st.Version = f.host(), "controldfake"
	st.MemoryTotalBytes = f.MemoryTotalBytes
	if st.MemoryTotalBytes == 0 {
		st.MemoryTotalBytes = lim.MaxMemoryBytes
	}
	st.MemoryAvailableBytes = max(0, st.MemoryTotalBytes-st.AdmittedMemoryBytes)
	st.Checkpoints = uint32(len(f.checkpoints))
	for _, id := range slices.Sorted(maps.Keys(f.pools)) {
		p := f.pools[id]
		st.Pools = append(st.Pools, &controldv1.PoolStatus{Id: p.GetId(), Name: p.GetName(), Size: p.GetSize(), Available: p.GetAvailable()})
	}
	return st, nil
}

func notFound(kind, reason, id string) error {
	return errdefs.WithReason(errdefs.ErrNotFound, reason, "%s %q not found", kind, id)
}

// rpcErr converts at the service boundary, as controld does.
func rpcErr(err error) error { return errgrpc.ToGRPC(err) }

// ---- sandboxes

func (f *Fake) endpointFor(sb *controldv1.Sandbox) *controldv1.Endpoint {
	if f.endpoint != nil {
		if ep := f.endpoint(sb); ep != nil {
			return proto.CloneOf(ep)
		}
	}
	return &controldv1.Endpoint{
		Url:   "ws://controld.invalid:7480/v1/sandboxes/" + sb.GetId() + "/aci",
		Token: "aci-" + sb.GetId(),
	}
}

func bootPhases(total time.Duration) []*controldv1.BootPhase {
	// The desktop image's waterfall: its xterm mapped and focused.
	names := []string{"create", "task_start", "guestd_listening", "x_up", "painted", "windows_mapped", "focused", "usable"}
	out := make([]*controldv1.BootPhase, len(names))
	for i, n := range names {
		out[i] = &controldv1.BootPhase{Name: n, At: durationpb.New(total * time.Duration(i+1) / time.Duration(len(names)))}
	}
	return out
}

// newSandbox records a sandbox; the caller holds f.mu.
func (f *Fake) newSandbox(image string, res *controldv1.Resources, scr *controldv1.Screen, labels map[string]string,
	ttl *durationpb.Duration, ready bool, mod func(*controldv1.Sandbox)) *controldv1.Sandbox {
	now := time.Now()
	if scr == nil {
		scr = &controldv1.Screen{Width: 1280, Height: 800, Depth: 24}
	} else if scr.GetDepth() == 0 {
		scr = &controldv1.Screen{Width: scr.GetWidth(), Height: scr.GetHeight(), Depth: 24}
	}
	sb := &controldv1.Sandbox{
		Id: rules.NewID(rules.PrefixSandbox), State: controldv1.SandboxState_SANDBOX_STATE_BOOTING, Image: image,
		Resources: proto.CloneOf(res), Screen: proto.CloneOf(scr), Labels: maps.Clone(labels),
		CreatedAt: timestamppb.New(now), Host: f.host(),
	}
	if sb.Resources == nil {
		sb.Resources = &controldv1.Resources{}
	}
	if ttl != nil {
		sb.ExpiresAt = timestamppb.New(now.Add(ttl.AsDuration()))
		f.expire(sb.Id, ttl.AsDuration())
	}
	if mod != nil {
		mod(sb)
	}
	f.sandboxes[sb.Id] = sb
	f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_CREATED, sb, nil)
	if ready {
		f.markReady(sb, 0)
	} else {
		f.readyCh[sb.Id] = make(chan struct{})
		id := sb.Id
		f.after(f.BootDelay, func() {
			if sb, ok := f.sandboxes[id]; ok && sb.State == controldv1.SandboxState_SANDBOX_STATE_BOOTING {
				f.markReady(sb, f.BootDelay)
			}
		})
	}
	return sb
}

func (f *Fake) markReady(sb *controldv1.Sandbox, took time.Duration) {
	sb.State = controldv1.SandboxState_SANDBOX_STATE_READY
	sb.ReadyAt = timestamppb.Now()
	sb.Boot = bootPhases(max(took, time.Millisecond))
	for _, ph := range sb.Boot {
		f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_PHASE, sb, ph)
	}
	f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, sb, nil)
	f.leaveBooting(sb.Id)
}

func (f *Fake) leaveBooting(id string) {
	if ch, ok := f.readyCh[id]; ok {
		close(ch)
		delete(f.readyCh, id)
	}
}

func (f *Fake) CreateSandbox(ctx context.Context, req *controldv1.CreateSandboxRequest) (*controldv1.CreateSandboxResponse, error) {
	resp, err := f.dedup.Do(ctx, controldv1.SandboxService_CreateSandbox_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.CreateSandboxResponse{} }, nil,
		func(context.Context, rules.Request) (proto.Message, error) { return f.createSandbox(req) })
	if err != nil {
		return nil, rpcErr(err)
	}
	return resp.(*controldv1.CreateSandboxResponse), nil
}

func (f *Fake) createSandbox(req *controldv1.CreateSandboxRequest) (*controldv1.CreateSandboxResponse, error) {
	if err := rules.Image("image", req.GetImage()); err != nil {
		return nil, err
	}
	res, err := f.limits().Resolve("resources", req.GetResources(), nil)
	if err != nil {
		return nil, err
	}
	if err := rules.Screen("screen", req.GetScreen()); err != nil {
		return nil, err
	}
	if err := rules.Env("env", req.GetEnv()); err != nil {
		return nil, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	if _, err := rules.TTL("ttl", req.GetTtl()); err != nil {
		return nil, err
	}
	if err := netpolicy.ValidateNetwork("network", req.GetNetwork()); err != nil {
		return nil, err
	}
	image := req.GetImage()
	if image == "" {
		image = DefaultImage
	}
	f.mu.Lock()
	if !f.images[image] {
		f.mu.Unlock()
		return nil, notFound("image", "IMAGE_NOT_FOUND", image)
	}
	if err := f.admit(res); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	nw := netpolicy.Normalize(req.GetNetwork())
	sb := f.newSandbox(image, res, req.GetScreen(), req.GetLabels(), req.GetTtl(), req.GetWaitReady() || f.BootDelay <= 0,
		func(sb *controldv1.Sandbox) { sb.Network, sb.RunAsRoot = nw, req.GetRunAsRoot() })
	resp := &controldv1.CreateSandboxResponse{Sandbox: proto.CloneOf(sb), Endpoint: f.endpointFor(sb)}
	f.mu.Unlock()
	return resp, nil
}

func (f *Fake) getSandbox(id string) (*controldv1.Sandbox, error) { return f.getSandboxField("id", id) }

func (f *Fake) getSandboxField(field, id string) (*controldv1.Sandbox, error) {
	if err := rules.SandboxID(field, id); err != nil {
		return nil, err
	}
	sb, ok := f.sandboxes[id]
	if !ok {
		return nil, notFound("sandbox", "SANDBOX_NOT_FOUND", id)
	}
	return sb, nil
}

func (f *Fake) GetSandbox(ctx context.Context, req *controldv1.GetSandboxRequest) (*controldv1.GetSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandbox(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.GetSandboxResponse{Sandbox: proto.CloneOf(sb)}, nil
}

func (f *Fake) ListSandboxes(ctx context.Context, req *controldv1.ListSandboxesRequest) (*controldv1.ListSandboxesResponse, error) {
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, rpcErr(err)
	}
	if err := rules.States("states", req.GetStates()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	var all []*controldv1.Sandbox
	for _, sb := range f.sandboxes {
		if !rules.MatchLabels(sb.GetLabels(), req.GetLabels()) {
			continue
		}
		if len(req.GetStates()) > 0 && !slices.Contains(req.GetStates(), sb.GetState()) {
			continue
		}
		all = append(all, proto.CloneOf(sb))
	}
	f.mu.Unlock()
	page, next, err := rules.Page(all, rules.SandboxKey, req.GetPageSize(), req.GetPageToken(), req)
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.ListSandboxesResponse{Sandboxes: page, NextPageToken: next}, nil
}

// deleteSandbox removes a sandbox; the caller holds f.mu.
func (f *Fake) deleteSandbox(id string) bool {
	sb, ok := f.sandboxes[id]
	if !ok {
		return false
	}
	delete(f.sandboxes, id)
	f.leaveBooting(id)
	if rec := f.activeRecording(id); rec != nil {
		stopRecording(rec, controldv1.RecordingStopReason_RECORDING_STOP_REASON_SANDBOX_GONE)
	}
	if ck, ok := f.checkpoints[sb.GetCheckpointId()]; ok && ck.LiveForks > 0 {
		ck.LiveForks--
		if ck.LiveForks == 0 && f.retiredCks[ck.GetId()] {
			delete(f.checkpoints, ck.GetId())
			delete(f.retiredCks, ck.GetId())
		}
	}
	sb.State = controldv1.SandboxState_SANDBOX_STATE_DELETED
	f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_DELETED, sb, nil)
	return true
}

func (f *Fake) DeleteSandbox(ctx context.Context, req *controldv1.DeleteSandboxRequest) (*controldv1.DeleteSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.getSandbox(req.GetId()); err != nil {
		return nil, rpcErr(err)
	}
	f.deleteSandbox(req.GetId())
	return &controldv1.DeleteSandboxResponse{}, nil
}

func (f *Fake) WaitSandboxReady(ctx context.Context, req *controldv1.WaitSandboxReadyRequest) (*controldv1.WaitSandboxReadyResponse, error) {
	timeout, err := rules.Duration("timeout", req.GetTimeout(), rules.MaxWaitTimeout)
	if err != nil {
		return nil, rpcErr(err)
	}
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		sb, err := f.getSandbox(req.GetId())
		if err != nil {
			f.mu.Unlock()
			return nil, rpcErr(err)
		}
		switch sb.GetState() {
		case controldv1.SandboxState_SANDBOX_STATE_READY:
			resp := &controldv1.WaitSandboxReadyResponse{Sandbox: proto.CloneOf(sb)}
			f.mu.Unlock()
			return resp, nil
		case controldv1.SandboxState_SANDBOX_STATE_CREATING, controldv1.SandboxState_SANDBOX_STATE_BOOTING:
		default:
			st := sb.GetState()
			f.mu.Unlock()
			return nil, rpcErr(errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_NOT_RUNNING",
				"sandbox %q is %s and cannot become ready", req.GetId(), st))
		}
		ch := f.readyCh[req.GetId()]
		f.mu.Unlock()
		if ch == nil {
			continue
		}
		select {
		case <-ch:
		case <-deadline.C:
			return nil, rpcErr(errdefs.WithReason(errdefs.ErrDeadlineExceeded, "SANDBOX_NOT_READY",
				"sandbox %q not ready after %v", req.GetId(), timeout))
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

func (f *Fake) GetSandboxEndpoint(ctx context.Context, req *controldv1.GetSandboxEndpointRequest) (*controldv1.GetSandboxEndpointResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandbox(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.GetSandboxEndpointResponse{Endpoint: f.endpointFor(sb)}, nil
}

func (f *Fake) transition(id string, from, to controldv1.SandboxState, verb string) (*controldv1.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandbox(id)
	if err != nil {
		return nil, err
	}
	if sb.GetState() != from {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_STATE",
			"cannot %s sandbox %q: it is %s, not %s", verb, id, sb.GetState(), from)
	}
	sb.State = to
	f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, sb, nil)
	return proto.CloneOf(sb), nil
}

func (f *Fake) SuspendSandbox(ctx context.Context, req *controldv1.SuspendSandboxRequest) (*controldv1.SuspendSandboxResponse, error) {
	sb, err := f.transition(req.GetId(), controldv1.SandboxState_SANDBOX_STATE_READY, controldv1.SandboxState_SANDBOX_STATE_SUSPENDED, "suspend")
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.SuspendSandboxResponse{Sandbox: sb}, nil
}

func (f *Fake) ResumeSandbox(ctx context.Context, req *controldv1.ResumeSandboxRequest) (*controldv1.ResumeSandboxResponse, error) {
	sb, err := f.transition(req.GetId(), controldv1.SandboxState_SANDBOX_STATE_SUSPENDED, controldv1.SandboxState_SANDBOX_STATE_READY, "resume")
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.ResumeSandboxResponse{Sandbox: sb}, nil
}

func (f *Fake) VerifySandbox(ctx context.Context, req *controldv1.VerifySandboxRequest) (*controldv1.VerifySandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandbox(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	ck, ok := f.checkpoints[sb.GetCheckpointId()]
	if !ok {
		return nil, rpcErr(errdefs.WithReason(errdefs.ErrFailedPrecondition, "NOT_FORKED",
			"sandbox %q was not forked from a checkpoint (or it is gone)", req.GetId()))
	}
	levels, err := rules.VerifyLevels("levels", req.GetLevels(), ck.GetVerifyLevels())
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.VerifySandboxResponse{Results: verifyResults(levels)}, nil
}

// verifyResults are the fake's proofs: every level passes.
func verifyResults(levels []controldv1.VerifyLevel) []*controldv1.VerifyResult {
	var out []*controldv1.VerifyResult
	for _, l := range levels {
		out = append(out, &controldv1.VerifyResult{Level: l, Ok: true, Detail: "fake: verified", Took: durationpb.New(time.Millisecond)})
	}
	return out
}

// ---- checkpoints

func (f *Fake) CreateCheckpoint(ctx context.Context, req *controldv1.CreateCheckpointRequest) (*controldv1.CreateCheckpointResponse, error) {
	resp, err := f.dedup.Do(ctx, controldv1.CheckpointService_CreateCheckpoint_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.CreateCheckpointResponse{} }, nil,
		func(context.Context, rules.Request) (proto.Message, error) { return f.createCheckpoint(req) })
	if err != nil {
		return nil, rpcErr(err)
	}
	return resp.(*controldv1.CreateCheckpointResponse), nil
}

func (f *Fake) createCheckpoint(req *controldv1.CreateCheckpointRequest) (*controldv1.CreateCheckpointResponse, error) {
	if err := rules.SandboxID("sandbox_id", req.GetSandboxId()); err != nil {
		return nil, err
	}
	tier, err := rules.Tier("tier", req.GetTier())
	if err != nil {
		return nil, err
	}
	if err := rules.Name("name", req.GetName()); err != nil {
		return nil, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandboxField("sandbox_id", req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if sb.GetState() != controldv1.SandboxState_SANDBOX_STATE_READY {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_STATE",
			"cannot checkpoint sandbox %q: it is %s, not READY", sb.GetId(), sb.GetState())
	}
	if err := f.nameFree(req.GetName()); err != nil {
		return nil, err
	}
	levels := []controldv1.VerifyLevel{controldv1.VerifyLevel_VERIFY_LEVEL_MARKER}
	var memBytes int64
	if tier == controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY {
		levels = append(levels, controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY, controldv1.VerifyLevel_VERIFY_LEVEL_PIXELS,
			controldv1.VerifyLevel_VERIFY_LEVEL_NETWORK)
		memBytes = 180 << 20
	}
	levels = append(levels, controldv1.VerifyLevel_VERIFY_LEVEL_FILESYSTEM)
	ck := &controldv1.Checkpoint{
		Id: rules.NewID(rules.PrefixCheckpoint), Name: req.GetName(), Tier: tier, State: controldv1.CheckpointState_CHECKPOINT_STATE_READY,
		SourceSandboxId: sb.GetId(), ParentCheckpointId: sb.GetCheckpointId(), Image: sb.GetImage(), RunAsRoot: sb.GetRunAsRoot(),
		Screen: proto.CloneOf(sb.GetScreen()), Resources: proto.CloneOf(sb.GetResources()), Labels: maps.Clone(req.GetLabels()),
		CreatedAt: timestamppb.Now(), MemoryBytes: memBytes, LayerBytes: 4 << 20, VerifyLevels: levels,
		Network: netpolicy.Normalize(sb.GetNetwork()), Host: f.host(),
		Timing: &controldv1.CheckpointTiming{Frozen: durationpb.New(40 * time.Millisecond), Dump: durationpb.New(30 * time.Millisecond),
			Layer: durationpb.New(10 * time.Millisecond), Total: durationpb.New(60 * time.Millisecond)},
	}
	if parent, ok := f.checkpoints[ck.ParentCheckpointId]; ok {
		parent.ChildIds = append(parent.ChildIds, ck.Id)
	}
	f.checkpoints[ck.Id] = ck
	if req.GetStop() {
		sb.State = controldv1.SandboxState_SANDBOX_STATE_STOPPED
		sb.StatusMessage = "stopped after checkpoint " + ck.Id
		f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, sb, nil)
	}
	return &controldv1.CreateCheckpointResponse{Checkpoint: proto.CloneOf(ck)}, nil
}

// nameFree refuses a checkpoint name in use; the caller holds f.mu.
func (f *Fake) nameFree(name string) error {
	if name == "" {
		return nil
	}
	for _, ck := range f.checkpoints {
		if ck.GetName() == name {
			return errdefs.WithReason(errdefs.ErrAlreadyExists, "CHECKPOINT_NAME_TAKEN", "a checkpoint named %q exists", name)
		}
	}
	return nil
}

func (f *Fake) getCheckpoint(field, idOrName string) (*controldv1.Checkpoint, error) {
	if err := rules.CheckpointRef(field, idOrName); err != nil {
		return nil, err
	}
	if ck, ok := f.checkpoints[idOrName]; ok {
		return ck, nil
	}
	for _, ck := range f.checkpoints {
		if ck.GetName() == idOrName {
			return ck, nil
		}
	}
	return nil, notFound("checkpoint", "CHECKPOINT_NOT_FOUND", idOrName)
}

func (f *Fake) GetCheckpoint(ctx context.Context, req *controldv1.GetCheckpointRequest) (*controldv1.GetCheckpointResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ck, err := f.getCheckpoint("id", req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.GetCheckpointResponse{Checkpoint: proto.CloneOf(ck)}, nil
}

// descendants returns id and every checkpoint below it, parents first.
func (f *Fake) descendants(id string) []string {
	out := []string{id}
	for i := 0; i < len(out); i++ {
		if ck, ok := f.checkpoints[out[i]]; ok {
			out = append(out, ck.GetChildIds()...)
		}
	}
	return out
}

func (f *Fake) ListCheckpoints(ctx context.Context, req *controldv1.ListCheckpointsRequest) (*controldv1.ListCheckpointsResponse, error) {
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	var ids []string
	if root := req.GetRootId(); root != "" {
		ck, err := f.getCheckpoint("root_id", root)
		if err != nil {
			f.mu.Unlock()
			return nil, rpcErr(err)
		}
		ids = f.descendants(ck.GetId())
	} else {
		for id := range f.checkpoints {
			ids = append(ids, id)
		}
	}
	var all []*controldv1.Checkpoint
	for _, id := range ids {
		if ck := f.checkpoints[id]; ck != nil && rules.MatchLabels(ck.GetLabels(), req.GetLabels()) {
			all = append(all, proto.CloneOf(ck))
		}
	}
	f.mu.Unlock()
	page, next, err := rules.Page(all, rules.CheckpointKey, req.GetPageSize(), req.GetPageToken(), req)
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.ListCheckpointsResponse{Checkpoints: page, NextPageToken: next}, nil
}

func (f *Fake) DeleteCheckpoint(ctx context.Context, req *controldv1.DeleteCheckpointRequest) (*controldv1.DeleteCheckpointResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ck, err := f.getCheckpoint("id", req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	if len(ck.GetChildIds()) > 0 && !req.GetCascade() {
		return nil, rpcErr(errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_HAS_CHILDREN",
			"checkpoint %q has %d child checkpoints; delete them first or cascade", ck.GetId(), len(ck.GetChildIds())))
	}
	for _, p := range f.pools {
		if p.GetCheckpointId() == ck.GetId() {
			return nil, rpcErr(errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IN_USE",
				"checkpoint %q feeds pool %q", ck.GetId(), p.GetId()))
		}
	}
	ids := f.descendants(ck.GetId())
	for pl, own := range f.poolCks {
		if slices.Contains(ids, own) {
			return nil, rpcErr(errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IN_USE",
				"checkpoint %s is pool %s's own (its misses fork from it); it goes with the pool", own, pl))
		}
	}
	if parent, ok := f.checkpoints[ck.GetParentCheckpointId()]; ok {
		parent.ChildIds = slices.DeleteFunc(parent.ChildIds, func(c string) bool { return c == ck.GetId() })
	}
	for _, id := range ids {
		delete(f.checkpoints, id)
	}
	return &controldv1.DeleteCheckpointResponse{DeletedIds: ids}, nil
}

func (f *Fake) ForkCheckpoint(ctx context.Context, req *controldv1.ForkCheckpointRequest) (*controldv1.ForkCheckpointResponse, error) {
	resp, err := f.dedup.Do(ctx, controldv1.CheckpointService_ForkCheckpoint_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.ForkCheckpointResponse{} }, nil,
		func(context.Context, rules.Request) (proto.Message, error) { return f.forkCheckpoint(req) })
	if err != nil {
		return nil, rpcErr(err)
	}
	return resp.(*controldv1.ForkCheckpointResponse), nil
}

func (f *Fake) forkCheckpoint(req *controldv1.ForkCheckpointRequest) (*controldv1.ForkCheckpointResponse, error) {
	if err := rules.ForkSource(req); err != nil {
		return nil, err
	}
	if err := rules.ForkCount("count", req.GetCount()); err != nil {
		return nil, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	if _, err := rules.TTL("ttl", req.GetTtl()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	id := req.GetCheckpointId()
	if ref := req.GetCheckpointReference(); ref != "" {
		// Pulled once, then forked from the import while it lives.
		if id = f.pulled[ref]; f.checkpoints[id] == nil {
			ck, err := f.importLocked(f.registry().get, ref, false)
			if err != nil {
				return nil, err
			}
			id = ck.GetId()
			f.pulled[ref] = id
		}
	}
	ck, err := f.getCheckpoint("checkpoint_id", id)
	if err != nil {
		return nil, err
	}
	levels, err := rules.VerifyLevels("verify", req.GetVerify(), ck.GetVerifyLevels())
	if err != nil {
		return nil, err
	}
	// The fake holds no pages: AUTO restores eagerly, LAZY as asked.
	mode, err := rules.RestoreMode("restore_mode", req.GetRestoreMode(), ck.GetTier())
	if err != nil {
		return nil, err
	}
	if mode == controldv1.RestoreMode_RESTORE_MODE_AUTO {
		mode = controldv1.RestoreMode_RESTORE_MODE_EAGER
	}
	policy, err := netpolicy.PolicyFor("network_policy", netpolicy.Mode(ck.GetNetwork()), req.GetNetworkPolicy(), ck.GetNetwork().GetPolicy())
	if err != nil {
		return nil, err
	}
	res, err := f.limits().Resolve("resources", req.GetResources(), ck.GetResources())
	if err != nil {
		return nil, err
	}
	resp := &controldv1.ForkCheckpointResponse{CheckpointId: ck.GetId()}
	for i := range int(req.GetCount()) {
		err := f.admit(res)
		if err == nil && f.FailReplica != nil {
			err = f.FailReplica(ck.GetId(), i)
		}
		if err != nil {
			resp.Replicas = append(resp.Replicas, &controldv1.ForkReplica{
				ErrorCode: int32(errgrpc.Code(err)), ErrorMessage: err.Error(), Took: durationpb.New(5 * time.Millisecond)})
			continue
		}
		sb := f.newSandbox(ck.GetImage(), res, ck.GetScreen(), req.GetLabels(), req.GetTtl(), true,
			func(sb *controldv1.Sandbox) {
				sb.CheckpointId, sb.Generation, sb.RunAsRoot = ck.GetId(), 1, ck.GetRunAsRoot()
				sb.Network = &controldv1.Network{Mode: netpolicy.Mode(ck.GetNetwork()), Policy: proto.CloneOf(policy)}
			})
		ck.LiveForks++
		rep := &controldv1.ForkReplica{
			Sandbox: proto.CloneOf(sb), Endpoint: f.endpointFor(sb), Verification: verifyResults(levels), Took: durationpb.New(20 * time.Millisecond),
			RestoreMode: mode}
		// Recordings follow forks as controld's do (recording.Manager.Forked).
		if parent := f.activeRecording(ck.GetSourceSandboxId()); req.GetRecord() || parent != nil {
			maxBytes := uint64(rules.DefaultRecordingBytes)
			if parent != nil {
				maxBytes = parent.GetMaxBytes()
			}
			rec := f.startRecording(sb.GetId(), maxBytes)
			rec.ParentCheckpointId = ck.GetId()
			if parent != nil {
				rec.ParentRecordingId = parent.GetId()
			}
			rep.RecordingId = rec.GetId()
		}
		resp.Replicas = append(resp.Replicas, rep)
	}
	return resp, nil
}

func (f *Fake) ExportCheckpoint(ctx context.Context, req *controldv1.ExportCheckpointRequest) (*controldv1.ExportCheckpointResponse, error) {
	if err := rules.CheckpointRef("id", req.GetId()); err != nil {
		return nil, rpcErr(err)
	}
	if err := reference(req.GetReference()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ck, err := f.getCheckpoint("id", req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	f.exported[req.GetReference()] = proto.CloneOf(ck)
	sum := sha256.Sum256([]byte(ck.GetId() + req.GetReference()))
	resp := &controldv1.ExportCheckpointResponse{Reference: req.GetReference(), Digest: "sha256:" + hex.EncodeToString(sum[:]),
		SizeBytes: ck.GetMemoryBytes() + ck.GetLayerBytes()}
	if req.GetPush() {
		f.registry().put(req.GetReference(), resp.Digest, ck)
		resp.PushedBytes = resp.SizeBytes
	}
	return resp, nil
}

// reference checks an image reference to export to or import from.
func reference(ref string) error {
	if ref == "" {
		return errdefs.InvalidField("reference", "required")
	}
	return rules.Image("reference", ref)
}

// ImportCheckpoint registers an exported checkpoint under a new id, its
// name, labels and proofs kept (a name in use here is ALREADY_EXISTS), as
// controld does.
func (f *Fake) ImportCheckpoint(ctx context.Context, req *controldv1.ImportCheckpointRequest) (*controldv1.ImportCheckpointResponse, error) {
	if err := reference(req.GetReference()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	from := func(ref string) (*controldv1.Checkpoint, bool) { ck, ok := f.exported[ref]; return ck, ok }
	if req.GetPull() {
		from = f.registry().get
	}
	ck, err := f.importLocked(from, req.GetReference(), true)
	if err != nil {
		return nil, rpcErr(err)
	}
	resp := &controldv1.ImportCheckpointResponse{Checkpoint: proto.CloneOf(ck)}
	if req.GetPull() {
		resp.PulledBytes = ck.GetMemoryBytes() + ck.GetLayerBytes()
	}
	return resp, nil
}

// importLocked registers the checkpoint images holds under ref as a new
// checkpoint, with its name when keepName (a fork's import of a remote
// checkpoint is a cache and takes no name, as in controld).
func (f *Fake) importLocked(images func(ref string) (*controldv1.Checkpoint, bool), ref string, keepName bool) (*controldv1.Checkpoint, error) {
	src, ok := images(ref)
	if !ok {
		return nil, notFound("checkpoint image", "IMAGE_NOT_FOUND", ref)
	}
	ck := proto.CloneOf(src)
	if !keepName {
		ck.Name = ""
	}
	if err := f.nameFree(ck.GetName()); err != nil {
		return nil, err
	}
	ck.Id, ck.ChildIds, ck.LiveForks, ck.Host = rules.NewID(rules.PrefixCheckpoint), nil, 0, f.host()
	if parent, ok := f.checkpoints[ck.GetParentCheckpointId()]; ok {
		parent.ChildIds = append(parent.ChildIds, ck.Id)
	} else {
		ck.ParentCheckpointId = ""
	}
	f.checkpoints[ck.Id] = ck
	return ck, nil
}

// Registry is an in-memory OCI registry of checkpoint images: by
// reference (repository:tag) and by digest (repository@sha256:...).
type Registry struct {
	mu     sync.Mutex
	images map[string]*controldv1.Checkpoint
}

// NewRegistry returns an empty registry to share between fakes.
func NewRegistry() *Registry { return &Registry{images: map[string]*controldv1.Checkpoint{}} }

// registry is the fake's registry, a private one made on first use; the
// caller holds f.mu.
func (f *Fake) registry() *Registry {
	if f.Registry == nil {
		f.Registry = NewRegistry()
	}
	return f.Registry
}

func (r *Registry) put(ref, digest string, ck *controldv1.Checkpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.images[ref] = proto.CloneOf(ck)
	r.images[repository(ref)+"@"+digest] = proto.CloneOf(ck)
}

func (r *Registry) get(ref string) (*controldv1.Checkpoint, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ck, ok := r.images[ref]
	return ck, ok
}

// repository is ref without its tag or digest.
func repository(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		return ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}
	return ref
}

// ---- pools

func (f *Fake) CreatePool(ctx context.Context, req *controldv1.CreatePoolRequest) (*controldv1.CreatePoolResponse, error) {
	if err := rules.Name("name", req.GetName()); err != nil {
		return nil, rpcErr(err)
	}
	switch src := req.GetSource().(type) {
	case nil:
		return nil, rpcErr(errdefs.InvalidField("source", "one of image or checkpoint_id is required"))
	case *controldv1.CreatePoolRequest_Image:
		if src.Image == "" {
			return nil, rpcErr(errdefs.InvalidField("image", "must not be empty (omit it for a checkpoint pool)"))
		}
		if err := rules.Image("image", src.Image); err != nil {
			return nil, rpcErr(err)
		}
	case *controldv1.CreatePoolRequest_CheckpointId:
		if err := rules.CheckpointRef("checkpoint_id", src.CheckpointId); err != nil {
			return nil, rpcErr(err)
		}
	}
	if err := rules.PoolSize("size", req.GetSize()); err != nil {
		return nil, rpcErr(err)
	}
	if err := rules.Screen("screen", req.GetScreen()); err != nil {
		return nil, rpcErr(err)
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var base *controldv1.Resources // a checkpoint pool's
	var ckNet *controldv1.Network
	src, fromCheckpoint := req.GetSource().(*controldv1.CreatePoolRequest_CheckpointId)
	if fromCheckpoint {
		ck, err := f.getCheckpoint("checkpoint_id", src.CheckpointId)
		if err != nil {
			return nil, rpcErr(err)
		}
		if req.GetScreen() != nil {
			return nil, rpcErr(errdefs.InvalidField("screen", "a checkpoint pool takes its geometry from the checkpoint"))
		}
		base, ckNet = ck.GetResources(), ck.GetNetwork()
	}
	nw, err := netpolicy.PoolNetwork("network", req.GetNetwork(), fromCheckpoint, ckNet)
	if err != nil {
		return nil, rpcErr(err)
	}
	res, err := f.limits().Resolve("resources", req.GetResources(), base)
	if err != nil {
		return nil, rpcErr(err)
	}
	for _, p := range f.pools {
		if req.GetName() != "" && p.GetName() == req.GetName() {
			return nil, rpcErr(errdefs.WithReason(errdefs.ErrAlreadyExists, "POOL_NAME_TAKEN", "a pool named %q exists", req.GetName()))
		}
	}
	p := &controldv1.Pool{Id: rules.NewID(rules.PrefixPool), Name: req.GetName(), Size: req.GetSize(), Available: req.GetSize(),
		Labels: maps.Clone(req.GetLabels()), Screen: proto.CloneOf(req.GetScreen()), Resources: res, Network: nw, Host: f.host()}
	switch src := req.GetSource().(type) {
	case *controldv1.CreatePoolRequest_Image:
		if !f.images[src.Image] {
			return nil, rpcErr(notFound("image", "IMAGE_NOT_FOUND", src.Image))
		}
		p.Image = src.Image
	case *controldv1.CreatePoolRequest_CheckpointId:
		ck, err := f.getCheckpoint("checkpoint_id", src.CheckpointId)
		if err != nil {
			return nil, rpcErr(err)
		}
		p.CheckpointId, p.Frozen = ck.GetId(), true
	}
	f.pools[p.Id] = p
	if p.GetImage() != "" {
		f.makePoolCheckpoint(p)
	}
	return &controldv1.CreatePoolResponse{Pool: proto.CloneOf(p)}, nil
}

func (f *Fake) getPool(field, id string) (*controldv1.Pool, error) {
	if err := rules.PoolID(field, id); err != nil {
		return nil, err
	}
	if p, ok := f.pools[id]; ok {
		return p, nil
	}
	return nil, notFound("pool", "POOL_NOT_FOUND", id)
}

func (f *Fake) GetPool(ctx context.Context, req *controldv1.GetPoolRequest) (*controldv1.GetPoolResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.getPool("id", req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.GetPoolResponse{Pool: proto.CloneOf(p)}, nil
}

func (f *Fake) ListPools(ctx context.Context, req *controldv1.ListPoolsRequest) (*controldv1.ListPoolsResponse, error) {
	f.mu.Lock()
	var all []*controldv1.Pool
	for _, p := range f.pools {
		all = append(all, proto.CloneOf(p))
	}
	f.mu.Unlock()
	page, next, err := rules.Page(all, rules.PoolKey, req.GetPageSize(), req.GetPageToken(), req)
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.ListPoolsResponse{Pools: page, NextPageToken: next}, nil
}

// UpdatePool changes a pool's size as controld does: warm members past a
// smaller size go, a larger pool fills up (after RefillDelay).
func (f *Fake) UpdatePool(ctx context.Context, req *controldv1.UpdatePoolRequest) (*controldv1.UpdatePoolResponse, error) {
	if err := rules.PoolID("id", req.GetId()); err != nil {
		return nil, rpcErr(err)
	}
	if err := rules.PoolSize("size", req.GetSize()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.getPool("id", req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	p.Size = req.GetSize()
	if p.Available > p.Size {
		p.Available = p.Size
	}
	if p.Available < p.Size && f.RefillDelay >= 0 {
		id := p.GetId()
		f.after(f.RefillDelay, func() {
			if p, ok := f.pools[id]; ok {
				p.Available = p.Size
			}
		})
	}
	return &controldv1.UpdatePoolResponse{Pool: proto.CloneOf(p)}, nil
}

func (f *Fake) DeletePool(ctx context.Context, req *controldv1.DeletePoolRequest) (*controldv1.DeletePoolResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.getPool("id", req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	delete(f.pools, p.GetId())
	if own, ok := f.poolCks[p.GetId()]; ok {
		delete(f.poolCks, p.GetId())
		if ck := f.checkpoints[own]; ck.GetLiveForks() > 0 {
			f.retiredCks[own] = true
		} else {
			delete(f.checkpoints, own)
		}
	}
	return &controldv1.DeletePoolResponse{}, nil
}

// makePoolCheckpoint gives image pool p its own checkpoint, as controld
// does once the pool is full (a fake pool is full at once): memory tier,
// labelled pool_id=<pool>, its source sandbox gone; p's misses fork from it.
func (f *Fake) makePoolCheckpoint(p *controldv1.Pool) {
	levels := []controldv1.VerifyLevel{controldv1.VerifyLevel_VERIFY_LEVEL_MARKER, controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY,
		controldv1.VerifyLevel_VERIFY_LEVEL_PIXELS, controldv1.VerifyLevel_VERIFY_LEVEL_NETWORK, controldv1.VerifyLevel_VERIFY_LEVEL_FILESYSTEM}
	ck := &controldv1.Checkpoint{
		Id: rules.NewID(rules.PrefixCheckpoint), Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY,
		State: controldv1.CheckpointState_CHECKPOINT_STATE_READY, SourceSandboxId: rules.NewID(rules.PrefixSandbox),
		Image: p.GetImage(), Screen: proto.CloneOf(p.GetScreen()), Resources: proto.CloneOf(p.GetResources()),
		Labels: map[string]string{rules.PoolIDLabel: p.GetId()}, CreatedAt: timestamppb.Now(), MemoryBytes: 180 << 20,
		LayerBytes: 4 << 20, VerifyLevels: levels, Network: netpolicy.Normalize(p.GetNetwork()), Host: f.host(),
		Timing: &controldv1.CheckpointTiming{Frozen: durationpb.New(40 * time.Millisecond), Dump: durationpb.New(30 * time.Millisecond),
			Layer: durationpb.New(10 * time.Millisecond), Total: durationpb.New(60 * time.Millisecond)},
	}
	f.checkpoints[ck.Id] = ck
	f.poolCks[p.GetId()] = ck.Id
}

func (f *Fake) ClaimPool(ctx context.Context, req *controldv1.ClaimPoolRequest) (*controldv1.ClaimPoolResponse, error) {
	resp, err := f.dedup.Do(ctx, controldv1.PoolService_ClaimPool_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.ClaimPoolResponse{} }, nil,
		func(context.Context, rules.Request) (proto.Message, error) { return f.claimPool(req) })
	if err != nil {
		return nil, rpcErr(err)
	}
	return resp.(*controldv1.ClaimPoolResponse), nil
}

func (f *Fake) claimPool(req *controldv1.ClaimPoolRequest) (*controldv1.ClaimPoolResponse, error) {
	if err := rules.PoolID("pool_id", req.GetPoolId()); err != nil {
		return nil, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	if _, err := rules.TTL("ttl", req.GetTtl()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.getPool("pool_id", req.GetPoolId())
	if err != nil {
		return nil, err
	}
	policy, err := netpolicy.PolicyFor("network_policy", netpolicy.Mode(p.GetNetwork()), req.GetNetworkPolicy(), p.GetNetwork().GetPolicy())
	if err != nil {
		return nil, err
	}
	hit := p.Available > 0
	if !hit {
		if err := f.admit(p.GetResources()); err != nil {
			return nil, err
		}
	}
	took := 2 * time.Millisecond
	if hit {
		p.Hits++
		p.Available--
		if f.RefillDelay >= 0 {
			id := p.GetId()
			f.after(f.RefillDelay, func() {
				if p, ok := f.pools[id]; ok && p.Available < p.Size {
					p.Available++
				}
			})
		}
	} else {
		p.Misses++
		took = 300 * time.Millisecond
	}
	ckID := p.GetCheckpointId()
	if own, ok := f.poolCks[p.GetId()]; ok && !hit {
		// An image pool's miss forks from the pool's own checkpoint.
		ckID, took = own, 100*time.Millisecond
	}
	labels := maps.Clone(p.GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, req.GetLabels())
	labels[rules.PoolIDLabel] = p.GetId()
	image := p.GetImage()
	ck := f.checkpoints[ckID]
	if ck != nil {
		image = ck.GetImage()
	}
	sb := f.newSandbox(image, p.GetResources(), p.GetScreen(), labels, req.GetTtl(), true, func(sb *controldv1.Sandbox) {
		sb.PoolId = p.GetId()
		sb.Network = &controldv1.Network{Mode: netpolicy.Mode(p.GetNetwork()), Policy: proto.CloneOf(policy)}
		if ck != nil {
			sb.CheckpointId, sb.Generation = ck.GetId(), 1
		}
	})
	if ck != nil {
		ck.LiveForks++
	}
	return &controldv1.ClaimPoolResponse{Sandbox: proto.CloneOf(sb), Endpoint: f.endpointFor(sb), Hit: hit, Took: durationpb.New(took)}, nil
}

// ---- network

func (f *Fake) UpdateSandboxNetwork(ctx context.Context, req *controldv1.UpdateSandboxNetworkRequest) (*controldv1.UpdateSandboxNetworkResponse, error) {
	if err := netpolicy.ValidatePolicy("policy", req.GetPolicy()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandbox(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	if netpolicy.Mode(sb.GetNetwork()) != controldv1.NetworkMode_NETWORK_MODE_EGRESS {
		return nil, rpcErr(errdefs.WithReason(errdefs.ErrFailedPrecondition, "NOT_EGRESS",
			"sandbox %s is in network mode %s; a policy needs NETWORK_MODE_EGRESS", sb.GetId(), netpolicy.Mode(sb.GetNetwork())))
	}
	sb.Network = &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS, Policy: proto.CloneOf(req.GetPolicy())}
	f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, sb, nil)
	return &controldv1.UpdateSandboxNetworkResponse{Sandbox: proto.CloneOf(sb)}, nil
}

// CreateViewTicket validates as controld does (rules.ViewTicketTTL) and
// returns a ticket on the fake gateway host; nothing serves it.
func (f *Fake) CreateViewTicket(ctx context.Context, req *controldv1.CreateViewTicketRequest) (*controldv1.CreateViewTicketResponse, error) {
	if err := rules.SandboxID("sandbox_id", req.GetSandboxId()); err != nil {
		return nil, rpcErr(err)
	}
	ttl, err := rules.ViewTicketTTL("ttl", req.GetTtl())
	if err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandboxField("sandbox_id", req.GetSandboxId())
	if err != nil {
		return nil, rpcErr(err)
	}
	ticket := rand.Text()
	return &controldv1.CreateViewTicketResponse{
		Url:       fmt.Sprintf("http://fake-gateway/v1/sandboxes/%s/view?ticket=%s", sb.GetId(), ticket),
		Ticket:    ticket,
		ExpiresAt: timestamppb.New(time.Now().Add(ttl)),
	}, nil
}

// ExposePort returns a URL on the fake gateway host; nothing serves it.
func (f *Fake) ExposePort(ctx context.Context, req *controldv1.ExposePortRequest) (*controldv1.ExposePortResponse, error) {
	if err := netpolicy.ValidatePort("port", req.GetPort()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandboxField("sandbox_id", req.GetSandboxId())
	if err != nil {
		return nil, rpcErr(err)
	}
	if f.ports == nil {
		f.ports = map[string]string{}
	}
	key := fmt.Sprintf("%s/%d", sb.GetId(), req.GetPort())
	tok, ok := f.ports[key]
	if !ok {
		n := 0
		for k := range f.ports {
			if strings.HasPrefix(k, sb.GetId()+"/") {
				n++
			}
		}
		if n >= netpolicy.MaxExposedPorts {
			return nil, rpcErr(errdefs.WithReason(errdefs.ErrResourceExhausted, "TOO_MANY_PORTS", "sandbox %s exposes %d ports already", sb.GetId(), n))
		}
		tok = "port-" + rules.NewID("tk-")
		f.ports[key] = tok
	}
	return &controldv1.ExposePortResponse{Url: fmt.Sprintf("http://fake-gateway/v1/sandboxes/%s/ports/%d/", sb.GetId(), req.GetPort()), Token: tok}, nil
}

func (f *Fake) UnexposePort(ctx context.Context, req *controldv1.UnexposePortRequest) (*controldv1.UnexposePortResponse, error) {
	if err := netpolicy.ValidatePort("port", req.GetPort()); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.getSandboxField("sandbox_id", req.GetSandboxId()); err != nil {
		return nil, rpcErr(err)
	}
	key := fmt.Sprintf("%s/%d", req.GetSandboxId(), req.GetPort())
	if _, ok := f.ports[key]; !ok {
		return nil, rpcErr(errdefs.WithReason(errdefs.ErrNotFound, "PORT_NOT_EXPOSED", "sandbox %s does not expose port %d", req.GetSandboxId(), req.GetPort()))
	}
	delete(f.ports, key)
	return &controldv1.UnexposePortResponse{}, nil
}

// ExtendSandbox sets a sandbox's expiry to ttl from now, as controld does.
func (f *Fake) ExtendSandbox(ctx context.Context, req *controldv1.ExtendSandboxRequest) (*controldv1.ExtendSandboxResponse, error) {
	if err := rules.SandboxID("id", req.GetId()); err != nil {
		return nil, rpcErr(err)
	}
	ttl, err := rules.RequiredTTL("ttl", req.GetTtl())
	if err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.getSandbox(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	sb.ExpiresAt = timestamppb.New(time.Now().Add(ttl))
	f.expire(sb.GetId(), ttl)
	f.emit(controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, sb, nil)
	return &controldv1.ExtendSandboxResponse{Sandbox: proto.CloneOf(sb)}, nil
}

// requestStore keeps the finished requests of request ids in memory.
type requestStore struct {
	mu sync.Mutex
	m  map[string]*rules.RequestRecord
}

func (s *requestStore) GetRequest(key string) (*rules.RequestRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key], nil
}

func (s *requestStore) PutRequest(r *rules.RequestRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*rules.RequestRecord{}
	}
	now := time.Now()
	for k, old := range s.m { // forget expired ids
		if now.After(old.Expires) {
			delete(s.m, k)
		}
	}
	s.m[r.Key] = r
	return nil
}
