// Package fleettest provides fakes of runtime.Runtime and fleet.GuestDialer
// for tests: an in-memory runtime whose sandboxes each own a fake guestd
// (readiness, memory mark, files, frame hash, tokens), with checkpoints
// written to real directories so the manager's rename and crash-recovery
// logic runs for real. With Runtime.SocketDir set, every guestd also serves
// the real ACI (api/aci/acitest) on a unix socket, for gateway tests.
package fleettest

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/aci/wire"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Runtime is a fake runtime.Runtime. Set the hook fields before use.
type Runtime struct {
	// SocketDir, when set, makes every guestd listen on a real unix socket
	// there (speaking the ACI through acitest). Otherwise sockets are
	// virtual paths only the fake Dialer knows.
	SocketDir string
	// ListenAfter and ReadyAfter delay when guestd accepts sessions and
	// reports the desktop ready, counted from task start.
	ListenAfter, ReadyAfter time.Duration
	// BootErr / RestoreErr / CheckpointErr fail those calls when they return
	// an error.
	BootErr       func(spec runtime.BootSpec) error
	RestoreErr    func(spec runtime.BootSpec, ref runtime.CheckpointRef) error
	CheckpointErr func(id string) error
	// NeverReady makes guestds never report ready.
	NeverReady bool
	// OnRestore, when set, may alter a restored guestd before it starts;
	// OnBoot a booted one.
	OnRestore func(spec runtime.BootSpec, g *Guestd)
	OnBoot    func(spec runtime.BootSpec, g *Guestd)
	// PrecreateErr fails Precreate when it returns an error; StartErr fails
	// the Boot of a precreated sandbox (which is then removed, as the real
	// runtime does when Start fails).
	PrecreateErr func(spec runtime.BootSpec) error
	StartErr     func(id string) error
	// NoEgress makes the runtime refuse network mode egress.
	NoEgress bool
	// ListGate, when set, holds every List until it is closed (List is
	// reconciliation's first look at the runtime: a test holds controld in
	// its startup).
	ListGate chan struct{}
	// LazyPageBytes is what LazyBytes reports for every checkpoint;
	// LazyErr, when set, is its error (lazy restore unavailable); LazyUnsafe
	// makes LazySafe false.
	LazyPageBytes int64
	LazyErr       error
	LazyUnsafe    bool

	mu        sync.Mutex
	completed []string                     // CompleteRestore's ids, in order
	hits      map[string]runtime.LimitHits // SetLimitHits
	instances map[string]*instance
	// precreated are sandboxes created but not started (Precreate): List
	// shows them as StatusCreated; IDs and Has do not count them.
	precreated map[string]precreated
	guests     map[string]*Guestd // by socket path
	exits      chan runtime.Exit
	deleted    map[string]int
	calls      map[string]int
	ckDeleted  []runtime.CheckpointRef
	ports      map[string]string // "id:port" -> address (ServePort)
	images     map[string]string // ref -> manifest digest (SetImageDigest)
	weights    map[string]uint32 // SetCPUWeight
}

// precreated is a sandbox Precreate made: its spec, and the digest of the
// image it was made from (a boot of it runs that build, as the real
// runtime's does, whatever the name names by then).
type precreated struct {
	spec   runtime.BootSpec
	digest string
}

type instance struct {
	inst  runtime.Instance
	spec  runtime.BootSpec
	guest *Guestd
	net   NetState
	// digest is the manifest digest of the image it runs (a boot: what
	// spec.Image named then; a restore: its checkpoint's).
	digest string
}

// NewRuntime returns an empty fake runtime.
func NewRuntime() *Runtime {
	return &Runtime{
		instances:  map[string]*instance{},
		precreated: map[string]precreated{},
		guests:     map[string]*Guestd{},
		exits:      make(chan runtime.Exit, 64),
		deleted:    map[string]int{},
		calls:      map[string]int{},
		weights:    map[string]uint32{},
	}
}

var (
	_ runtime.Runtime       = (*Runtime)(nil)
	_ runtime.Precreator    = (*Runtime)(nil)
	_ runtime.LimitProbe    = (*Runtime)(nil)
	_ runtime.ImageResolver = (*Runtime)(nil)
	_ runtime.CPUWeighter   = (*Runtime)(nil)
)

// SetImageDigest makes ref name an image of manifest digest dg from now on
// (a re-tag or a new pull of the same name). Without it a ref names a
// digest derived from the ref itself.
func (r *Runtime) SetImageDigest(ref, dg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.images == nil {
		r.images = map[string]string{}
	}
	r.images[ref] = dg
}

func (r *Runtime) imageDigestLocked(ref string) string {
	if dg, ok := r.images[ref]; ok {
		return dg
	}
	sum := sha256.Sum256([]byte(ref))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ImageDigest implements runtime.ImageResolver.
func (r *Runtime) ImageDigest(ctx context.Context, ref string) (string, error) {
	r.count("image_digest")
	if err := ctx.Err(); err != nil {
		return "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.imageDigestLocked(ref), nil
}

// RunningDigest is the manifest digest of the image sandbox id runs ("":
// no such sandbox).
func (r *Runtime) RunningDigest(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in, ok := r.instances[id]; ok {
		return in.digest
	}
	return ""
}

// setDigest records the image digest instance id runs.
func (r *Runtime) setDigest(id, dg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in, ok := r.instances[id]; ok {
		in.digest = dg
		in.inst.ImageDigest = dg
	}
}

// LazyBytes implements runtime.LazyRestorer.
func (r *Runtime) LazyBytes(context.Context, runtime.CheckpointRef) (int64, error) {
	return r.LazyPageBytes, r.LazyErr
}

// LazySafe implements runtime.LazyRestorer.
func (r *Runtime) LazySafe() bool { return !r.LazyUnsafe }

// CompleteRestore implements runtime.LazyRestorer.
func (r *Runtime) CompleteRestore(id string) {
	r.mu.Lock()
	r.completed = append(r.completed, id)
	r.mu.Unlock()
}

// SetLazyPending makes id a lazy replica whose page server was another
// controld's (Instance.LazyPending).
func (r *Runtime) SetLazyPending(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in := r.instances[id]; in != nil {
		in.inst.LazyPending = true
	}
}

// LazyStats implements runtime.LazyRestorer: a replica not completed yet
// had one fault.
func (r *Runtime) LazyStats(id string) (runtime.LazyStats, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.Contains(r.completed, id) {
		return runtime.LazyStats{}, false
	}
	return runtime.LazyStats{LazyPages: r.LazyPageBytes / 4096, Faults: 1, FaultPages: 1}, true
}

// Completed returns the ids CompleteRestore was called with, in order.
func (r *Runtime) Completed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.completed)
}

func (r *Runtime) count(op string) {
	r.mu.Lock()
	r.calls[op]++
	r.mu.Unlock()
}

// Calls returns how often op ("boot", "restore", "delete", ...) was called.
func (r *Runtime) Calls(op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[op]
}

// Guest returns the fake guestd of a sandbox (nil when unknown).
func (r *Runtime) Guest(id string) *Guestd {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in, ok := r.instances[id]; ok {
		return in.guest
	}
	return nil
}

// StartedIDs returns the ids of the instances that were started: sandboxes,
// not precreated warm slots.
func (r *Runtime) StartedIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.instances {
		if _, pre := r.precreated[id]; !pre {
			out = append(out, id)
		}
	}
	return out
}

// IDs returns the ids of every instance.
func (r *Runtime) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.instances {
		out = append(out, id)
	}
	return out
}

// Has reports whether the runtime holds a sandbox.
func (r *Runtime) Has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.instances[id]
	return ok
}

// Adopt adds an instance that no controld created (an orphan).
func (r *Runtime) Adopt(in runtime.Instance) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.instances[in.ID] = &instance{inst: in}
}

// Vanish drops an instance behind controld's back.
func (r *Runtime) Vanish(id string) {
	r.mu.Lock()
	in := r.instances[id]
	delete(r.instances, id)
	r.mu.Unlock()
	if in != nil && in.guest != nil {
		in.guest.stop()
	}
}

// Exit makes a sandbox's task exit on its own.
func (r *Runtime) Exit(id string, status uint32) {
	r.mu.Lock()
	if in, ok := r.instances[id]; ok {
		in.inst.Status = runtime.StatusStopped
	}
	r.mu.Unlock()
	r.exits <- runtime.Exit{ID: id, Status: status, ExitedAt: time.Now()}
}

// DeletedCheckpoints returns the refs DeleteCheckpoint was called with.
func (r *Runtime) DeletedCheckpoints() []runtime.CheckpointRef {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]runtime.CheckpointRef(nil), r.ckDeleted...)
}

// Close stops every guestd socket server.
func (r *Runtime) Close() {
	r.mu.Lock()
	var gs []*Guestd
	for _, in := range r.instances {
		if in.guest != nil {
			gs = append(gs, in.guest)
		}
	}
	r.mu.Unlock()
	for _, g := range gs {
		g.stop()
	}
}

// selfAddr is this process as a sandbox init (pid and start time).
var selfAddr = func() guestsock.Addr {
	a, err := guestsock.Self("/fake")
	if err != nil {
		panic(err) // /proc/self always exists on Linux
	}
	return a
}()

func (r *Runtime) socketPath(id string) string {
	if r.SocketDir != "" {
		return filepath.Join(r.SocketDir, id+".sock")
	}
	return "/fake/" + id + "/aci.sock"
}

func (r *Runtime) start(ctx context.Context, spec runtime.BootSpec, g *Guestd) (runtime.Instance, error) {
	if err := ctx.Err(); err != nil {
		return runtime.Instance{}, err
	}
	r.mu.Lock()
	if _, dup := r.instances[spec.ID]; dup {
		r.mu.Unlock()
		return runtime.Instance{}, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	r.mu.Unlock()
	now := time.Now()
	g.socket = r.socketPath(spec.ID)
	g.listenAt = now.Add(r.ListenAfter)
	g.readyAt = now.Add(r.ReadyAfter)
	g.neverReady = r.NeverReady
	g.startedAt = now
	if r.SocketDir != "" {
		if err := g.serve(); err != nil {
			return runtime.Instance{}, err
		}
	}
	labels := map[string]string{}
	for k, v := range spec.Labels {
		labels[k] = v
	}
	// This process stands in for every sandbox's init: its root is the
	// root guestsock resolves g.socket in (the real gateway dials it).
	in := runtime.Instance{ID: spec.ID, PID: selfAddr.PID, Status: runtime.StatusRunning,
		ACISocket: guestsock.Addr{PID: selfAddr.PID, Start: selfAddr.Start, Path: g.socket},
		Labels:    labels, CreatedAt: now, TaskStartedAt: now}
	r.mu.Lock()
	r.instances[spec.ID] = &instance{inst: in, spec: spec, guest: g,
		net: NetState{Spec: spec.Network, Policy: spec.Network.Policy, Connected: !spec.Network.Hold}}
	r.guests[g.socket] = g
	r.mu.Unlock()
	return in, nil
}

// Boot implements runtime.Runtime. A sandbox precreated with an identical
// spec is only started ("boot_precreated"); one precreated with another
// spec is removed first, as the real runtime does.
func (r *Runtime) Boot(ctx context.Context, spec runtime.BootSpec) (runtime.Instance, error) {
	r.count("boot")
	r.mu.Lock()
	pre, wasPrecreated := r.precreated[spec.ID]
	delete(r.precreated, spec.ID)
	dg := r.imageDigestLocked(spec.Image)
	r.mu.Unlock()
	if wasPrecreated && reflect.DeepEqual(pre.spec, spec) {
		dg = pre.digest
		r.count("boot_precreated")
		if r.StartErr != nil {
			if err := r.StartErr(spec.ID); err != nil {
				return runtime.Instance{}, fmt.Errorf("sandbox %s: start: %w", spec.ID, err)
			}
		}
	} else if r.BootErr != nil {
		if err := r.BootErr(spec); err != nil {
			return runtime.Instance{}, err
		}
	}
	g := newGuestd(spec.ID, spec.AdminToken, spec.ACIToken)
	if r.OnBoot != nil {
		r.OnBoot(spec, g)
	}
	inst, err := r.start(ctx, spec, g)
	if err == nil {
		r.setDigest(spec.ID, dg)
		inst.ImageDigest = dg
	}
	return inst, err
}

// Precreate implements runtime.Precreator.
func (r *Runtime) Precreate(ctx context.Context, spec runtime.BootSpec) error {
	r.count("precreate")
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.PrecreateErr != nil {
		if err := r.PrecreateErr(spec); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.instances[spec.ID]; dup {
		return fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	if _, dup := r.precreated[spec.ID]; dup {
		return fmt.Errorf("sandbox %s: %w (already precreated)", spec.ID, errdefs.ErrAlreadyExists)
	}
	r.precreated[spec.ID] = precreated{spec: spec, digest: r.imageDigestLocked(spec.Image)}
	return nil
}

// Discard implements runtime.Precreator.
func (r *Runtime) Discard(_ context.Context, id string) error {
	r.count("discard")
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.precreated[id]; !ok {
		return fmt.Errorf("sandbox %s: %w (not precreated)", id, errdefs.ErrNotFound)
	}
	delete(r.precreated, id)
	return nil
}

// SetLimitHits sets what LimitHits reports for sandbox id.
func (r *Runtime) SetLimitHits(id string, h runtime.LimitHits) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hits == nil {
		r.hits = map[string]runtime.LimitHits{}
	}
	r.hits[id] = h
}

// LimitHits implements runtime.LimitProbe: what SetLimitHits set (zero
// counts otherwise) for a running sandbox.
func (r *Runtime) LimitHits(_ context.Context, id string) (runtime.LimitHits, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.instances[id]; !ok {
		return runtime.LimitHits{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return r.hits[id], nil
}

// Usage implements runtime.UsageProbe for a running sandbox: a fixed use
// (1.5 CPU seconds, 64 MiB), enough for the metrics to be there.
func (r *Runtime) Usage(_ context.Context, id string) (runtime.Usage, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.instances[id]; !ok {
		return runtime.Usage{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return runtime.Usage{CPUSeconds: 1.5, MemoryBytes: 64 << 20}, nil
}

// SetCPUWeight implements runtime.CPUWeighter for a running sandbox.
func (r *Runtime) SetCPUWeight(_ context.Context, id string, weight uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.instances[id]; !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	r.weights[id] = weight
	return nil
}

// CPUWeight returns the weight SetCPUWeight last gave sandbox id, and
// whether it was called.
func (r *Runtime) CPUWeight(id string) (uint32, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.weights[id]
	return w, ok
}

// Spec returns the spec a running sandbox was booted or restored with.
func (r *Runtime) Spec(id string) (runtime.BootSpec, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return runtime.BootSpec{}, false
	}
	return in.spec, true
}

// Precreated returns the ids of the sandboxes precreated and not booted.
func (r *Runtime) Precreated() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.precreated {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// ckState is what the fake writes into a checkpoint directory.
type ckState struct {
	AdminToken  string            `json:"admin_token"`
	Generation  uint64            `json:"generation"`
	Mark        []byte            `json:"mark"`
	NetValue    []byte            `json:"net_value"`
	NetPort     uint32            `json:"net_port"`
	Files       map[string][]byte `json:"files"`
	FrameHash   []byte            `json:"frame_hash"`
	Painting    []byte            `json:"painting,omitempty"`
	Animating   bool              `json:"animating"`
	Tier        runtime.CheckpointTier
	Snapshot    string
	Image       string
	ImageDigest string
}

const stateFile = "fake-checkpoint.json"

// Restore implements runtime.Runtime.
func (r *Runtime) Restore(ctx context.Context, spec runtime.BootSpec, ref runtime.CheckpointRef) (runtime.Instance, error) {
	r.count("restore")
	if r.RestoreErr != nil {
		if err := r.RestoreErr(spec, ref); err != nil {
			return runtime.Instance{}, err
		}
	}
	b, err := os.ReadFile(filepath.Join(ref.Dir, stateFile))
	if err != nil {
		return runtime.Instance{}, fmt.Errorf("checkpoint %s: %w", ref.Dir, errdefs.ErrNotFound)
	}
	var st ckState
	if err := json.Unmarshal(b, &st); err != nil {
		return runtime.Instance{}, err
	}
	var g *Guestd
	if st.Tier == runtime.TierDisk {
		// Boots fresh from the layer: files survive, memory does not.
		g = newGuestd(spec.ID, spec.AdminToken, spec.ACIToken)
	} else {
		// The restored guestd is the source's: its tokens, mark, screen.
		g = newGuestd("source", st.AdminToken, "source-token-until-restored")
		g.mark = st.Mark
		g.netValue, g.netPort = st.NetValue, st.NetPort
		g.frameHash, g.painting = st.FrameHash, st.Painting
		g.animating = st.Animating
		g.generation = st.Generation
	}
	for k, v := range st.Files {
		g.files[k] = v
	}
	if r.OnRestore != nil {
		r.OnRestore(spec, g)
	}
	inst, err := r.start(ctx, spec, g)
	if err == nil {
		r.setDigest(spec.ID, st.ImageDigest)
		inst.ImageDigest = st.ImageDigest
	}
	return inst, err
}

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(_ context.Context, id string) error {
	r.count("delete")
	r.mu.Lock()
	if _, ok := r.precreated[id]; ok {
		delete(r.precreated, id)
		r.deleted[id]++
		r.mu.Unlock()
		return nil
	}
	in, ok := r.instances[id]
	if ok {
		delete(r.instances, id)
		if in.guest != nil {
			delete(r.guests, in.guest.socket)
		}
		r.deleted[id]++
	}
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if in.guest != nil {
		in.guest.stop()
	}
	return nil
}

// List implements runtime.Runtime.
func (r *Runtime) List(ctx context.Context) ([]runtime.Instance, error) {
	r.count("list")
	if g := r.ListGate; g != nil {
		select {
		case <-g:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]runtime.Instance, 0, len(r.instances)+len(r.precreated))
	for _, in := range r.instances {
		out = append(out, in.inst)
	}
	for id, pre := range r.precreated {
		labels := map[string]string{}
		for k, v := range pre.spec.Labels {
			labels[k] = v
		}
		out = append(out, runtime.Instance{ID: id, Status: runtime.StatusCreated, Labels: labels})
	}
	return out, nil
}

func (r *Runtime) setStatus(id string, s runtime.InstanceStatus) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	in.inst.Status = s
	if in.guest != nil {
		in.guest.setFrozen(s == runtime.StatusFrozen)
	}
	return nil
}

// Freeze implements runtime.Runtime.
func (r *Runtime) Freeze(_ context.Context, id string) error {
	r.count("freeze")
	return r.setStatus(id, runtime.StatusFrozen)
}

// Thaw implements runtime.Runtime.
func (r *Runtime) Thaw(_ context.Context, id string) error {
	r.count("thaw")
	return r.setStatus(id, runtime.StatusRunning)
}

// Status returns an instance's status.
func (r *Runtime) Status(id string) runtime.InstanceStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in, ok := r.instances[id]; ok {
		return in.inst.Status
	}
	return runtime.StatusUnknown
}

// Checkpoint implements runtime.Runtime: BeforeFreeze, freeze, write the
// directory, AfterFreeze, thaw (or stop).
func (r *Runtime) Checkpoint(ctx context.Context, id string, spec runtime.CheckpointSpec) (runtime.CheckpointResult, error) {
	r.count("checkpoint")
	start := time.Now()
	r.mu.Lock()
	in, ok := r.instances[id]
	r.mu.Unlock()
	if !ok {
		return runtime.CheckpointResult{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if _, err := os.Stat(spec.Dir); err == nil {
		return runtime.CheckpointResult{}, fmt.Errorf("checkpoint dir %s: %w", spec.Dir, errdefs.ErrAlreadyExists)
	}
	if spec.BeforeFreeze != nil {
		if err := spec.BeforeFreeze(ctx); err != nil {
			return runtime.CheckpointResult{}, err
		}
	}
	if r.CheckpointErr != nil {
		if err := r.CheckpointErr(id); err != nil {
			return runtime.CheckpointResult{}, err
		}
	}
	frozeAt := time.Now()
	g := in.guest
	st := g.snapshot()
	st.Tier, st.Snapshot, st.Image = spec.Tier, "snap-"+filepath.Base(spec.Dir), "image"
	if in.spec.Image != "" {
		st.Image = in.spec.Image
	}
	r.mu.Lock()
	st.ImageDigest = in.digest
	r.mu.Unlock()
	if spec.Tier == runtime.TierDisk {
		st.Mark, st.FrameHash = nil, nil
	}
	b, _ := json.Marshal(st)
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return runtime.CheckpointResult{}, err
	}
	if err := os.WriteFile(filepath.Join(spec.Dir, stateFile), b, 0o600); err != nil {
		os.RemoveAll(spec.Dir)
		return runtime.CheckpointResult{}, err
	}
	if spec.AfterFreeze != nil {
		if err := spec.AfterFreeze(ctx); err != nil {
			os.RemoveAll(spec.Dir)
			return runtime.CheckpointResult{}, err
		}
	}
	frozen := time.Since(frozeAt)
	if spec.Stop {
		r.setStatus(id, runtime.StatusStopped)
	}
	return runtime.CheckpointResult{
		Ref:         runtime.CheckpointRef{Dir: spec.Dir, Snapshot: st.Snapshot, Image: st.Image, Tier: spec.Tier, ImageDigest: st.ImageDigest},
		MemoryBytes: int64(len(b)), LayerBytes: 4096,
		Frozen: frozen, Dump: frozen, Layer: time.Microsecond, Total: time.Since(start),
	}, nil
}

// DeleteCheckpoint implements runtime.Runtime.
func (r *Runtime) DeleteCheckpoint(_ context.Context, ref runtime.CheckpointRef) error {
	r.count("delete_checkpoint")
	r.mu.Lock()
	r.ckDeleted = append(r.ckDeleted, ref)
	r.mu.Unlock()
	return nil
}

// Exits implements runtime.Runtime.
func (r *Runtime) Exits(ctx context.Context) (<-chan runtime.Exit, error) {
	out := make(chan runtime.Exit)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ex := <-r.exits:
				select {
				case out <- ex:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// Guestd is one fake guestd.
type Guestd struct {
	mu         sync.Mutex
	sandboxID  string
	adminToken string
	aciToken   string
	generation uint64
	mark       []byte
	netValue   []byte // the net probe listener's key and port
	netPort    uint32
	// LoopbackDown makes net probes fail as on a replica without lo (the
	// bug the network verifier catches).
	LoopbackDown bool
	files        map[string][]byte
	frameHash    []byte
	// painting is the frame the apps are still drawing towards (SetPainting):
	// the screen becomes it once something waits for it to settle. A memory
	// checkpoint carries the paint in flight, as a dump carries the apps'
	// pending output.
	painting    []byte
	animating   bool // every FrameHash finds a new frame
	socket      string
	listenAt    time.Time
	readyAt     time.Time
	startedAt   time.Time
	neverReady  bool
	frozen      bool
	thawed      chan struct{} // while frozen: closed at the thaw
	stopped     bool
	restored    int
	entropy     []byte
	appsHeld    bool // Restored with HoldApps, no ResumeApps since
	appsResumed bool // a ResumeApps found them held

	srv *acitest.Server
	hs  *http.Server
	ln  net.Listener
}

func newGuestd(id, admin, aci string) *Guestd {
	h := sha256.Sum256([]byte("desktop-" + id))
	return &Guestd{sandboxID: id, adminToken: admin, aciToken: aci, files: map[string][]byte{}, frameHash: h[:16]}
}

func (g *Guestd) snapshot() ckState {
	g.mu.Lock()
	defer g.mu.Unlock()
	files := map[string][]byte{}
	for k, v := range g.files {
		files[k] = v
	}
	return ckState{AdminToken: g.adminToken, Generation: g.generation, Mark: g.mark, NetValue: g.netValue, NetPort: g.netPort,
		Files: files, FrameHash: g.frameHash, Painting: g.painting, Animating: g.animating}
}

// SandboxID is who guestd believes it is.
func (g *Guestd) SandboxID() string { g.mu.Lock(); defer g.mu.Unlock(); return g.sandboxID }

// ACIToken is the token agents must present.
func (g *Guestd) ACIToken() string { g.mu.Lock(); defer g.mu.Unlock(); return g.aciToken }

// Generation is the restore generation.
func (g *Guestd) Generation() uint64 { g.mu.Lock(); defer g.mu.Unlock(); return g.generation }

// Restored counts Restored notifications.
func (g *Guestd) Restored() int { g.mu.Lock(); defer g.mu.Unlock(); return g.restored }

// AppsHeld reports whether the apps are held stopped (Restored with
// HoldApps and no ResumeApps since).
func (g *Guestd) AppsHeld() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.appsHeld }

// AppsResumed reports whether a ResumeApps continued held apps.
func (g *Guestd) AppsResumed() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.appsResumed }

// Entropy is the last entropy received.
func (g *Guestd) Entropy() []byte { g.mu.Lock(); defer g.mu.Unlock(); return g.entropy }

// SetAnimating makes the screen change before every FrameHash (and
// CheckpointPrepare) answers, as an animating page does; replicas inherit it.
func (g *Guestd) SetAnimating(on bool) { g.mu.Lock(); g.animating = on; g.mu.Unlock() }

// SetFrameHash changes the screen.
func (g *Guestd) SetFrameHash(h []byte) { g.mu.Lock(); g.frameHash = h; g.mu.Unlock() }

// SetPainting makes the apps still draw towards frame h: the screen
// becomes h at the next FrameHash that waits for it to settle.
func (g *Guestd) SetPainting(h []byte) { g.mu.Lock(); g.painting = h; g.mu.Unlock() }

// FrameNow is the screen's frame hash, without waiting for anything.
func (g *Guestd) FrameNow() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]byte(nil), g.frameHash...)
}

// SetFile changes a file.
func (g *Guestd) SetFile(p string, b []byte) { g.mu.Lock(); g.files[p] = b; g.mu.Unlock() }

// SetMark changes the memory mark.
func (g *Guestd) SetMark(b []byte) { g.mu.Lock(); g.mark = b; g.mu.Unlock() }

// SetReadyAt changes when the desktop reports ready.
func (g *Guestd) SetReadyAt(t time.Time) { g.mu.Lock(); g.readyAt = t; g.mu.Unlock() }

func (g *Guestd) setFrozen(f bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !f {
		g.thawLocked()
		return
	}
	if !g.frozen {
		g.thawed = make(chan struct{})
	}
	g.frozen = true
}

// thawLocked ends a freeze: requests waiting on its sessions go on.
func (g *Guestd) thawLocked() {
	if g.frozen {
		close(g.thawed)
		g.thawed, g.frozen = nil, false
	}
}

// serve starts the real ACI listener: auth against the current admin or
// ACI token, then acitest's handler.
func (g *Guestd) serve() error {
	os.Remove(g.socket)
	ln, err := net.Listen("unix", g.socket)
	if err != nil {
		return err
	}
	g.srv = acitest.NewServer()
	g.srv.SandboxID = g.sandboxID
	g.ln = ln
	g.hs = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		got := req.Header.Get("Authorization")
		g.mu.Lock()
		okAdmin := subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+g.adminToken)) == 1
		okACI := subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+g.aciToken)) == 1
		g.mu.Unlock()
		if !okAdmin && !okACI {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		g.srv.ServeHTTP(w, req)
	})}
	go g.hs.Serve(ln)
	return nil
}

func (g *Guestd) stop() {
	g.mu.Lock()
	g.stopped = true
	g.thawLocked() // its sessions end: requests waiting on them fail
	hs, srv := g.hs, g.srv
	g.hs, g.srv = nil, nil
	g.mu.Unlock()
	if hs != nil {
		hs.Close()
		srv.Close()
		os.Remove(g.socket)
	}
}

// Dialer is the fake fleet.GuestDialer over the Runtime's guestds.
type Dialer struct{ R *Runtime }

var _ fleet.GuestDialer = Dialer{}

// DialGuest implements fleet.GuestDialer.
func (d Dialer) DialGuest(ctx context.Context, addr guestsock.Addr, token string) (fleet.Guest, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path := addr.Path
	d.R.mu.Lock()
	g, ok := d.R.guests[path]
	d.R.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("dial %s: no such socket: %w", path, errdefs.ErrUnavailable)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.stopped:
		return nil, fmt.Errorf("dial %s: connection refused: %w", path, errdefs.ErrUnavailable)
	case time.Now().Before(g.listenAt):
		return nil, fmt.Errorf("dial %s: no such file: %w", path, errdefs.ErrUnavailable)
	case g.frozen:
		// A frozen guestd accepts the connection but never answers.
		return nil, fmt.Errorf("dial %s: %w", path, context.DeadlineExceeded)
	case subtle.ConstantTimeCompare([]byte(token), []byte(g.adminToken)) != 1:
		return nil, fmt.Errorf("dial %s: bad token: %w", path, errdefs.ErrPermissionDenied)
	}
	return &guest{g: g, hello: fleet.GuestHello{SandboxID: g.sandboxID, Generation: g.generation}}, nil
}

type guest struct {
	g      *Guestd
	hello  fleet.GuestHello
	mu     sync.Mutex
	closed bool
}

var _ fleet.Guest = (*guest)(nil)

var errClosed = errors.New("fake guest: session closed")

func (s *guest) check(ctx context.Context) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return errClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.g.mu.Lock()
	thawed := s.g.thawed
	s.g.mu.Unlock()
	if thawed != nil {
		// A request on a frozen guestd's open session waits in its socket
		// until the thaw.
		select {
		case <-thawed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if s.g.stopped {
		return fmt.Errorf("fake guest: %w", errdefs.ErrUnavailable)
	}
	return nil
}

func (s *guest) state(now time.Time) fleet.ReadyState {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if s.g.neverReady || now.Before(s.g.readyAt) {
		return fleet.ReadyState{}
	}
	ms := uint64(s.g.readyAt.Sub(s.g.startedAt)/time.Millisecond) + 1
	// Like the desktop image: its xterm mapped and focused.
	return fleet.ReadyState{Ready: true, XUp: true, WMUp: true, Painted: true, XUpMs: ms, WMUpMs: ms, PaintedMs: ms,
		WindowsMappedMs: ms, FocusedMs: ms}
}

func (s *guest) WaitReady(ctx context.Context, onState func(fleet.ReadyState)) (fleet.ReadyState, error) {
	if err := s.check(ctx); err != nil {
		return fleet.ReadyState{}, err
	}
	st := s.state(time.Now())
	if onState != nil {
		onState(st)
	}
	for !st.Ready {
		s.g.mu.Lock()
		wait := time.Until(s.g.readyAt)
		never := s.g.neverReady
		s.g.mu.Unlock()
		if never {
			<-ctx.Done()
			return st, ctx.Err()
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(max(wait, 0)):
		}
		if err := s.check(ctx); err != nil {
			return st, err
		}
		st = s.state(time.Now())
		if onState != nil {
			onState(st)
		}
	}
	return st, nil
}

func (s *guest) MemoryMark(ctx context.Context, value []byte) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	s.g.SetMark(append([]byte(nil), value...))
	return nil
}

func (s *guest) MemoryChallenge(ctx context.Context, nonce []byte) ([]byte, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if s.g.mark == nil {
		return nil, fmt.Errorf("no memory mark: %w", errdefs.ErrFailedPrecondition)
	}
	return wire.ProofMAC(s.g.mark, nonce), nil
}

func (s *guest) NetProbeListen(ctx context.Context, value []byte) (uint32, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if s.g.netPort == 0 {
		s.g.netPort = 40000 + uint32(len(s.g.sandboxID))
	}
	s.g.netValue = append([]byte(nil), value...)
	return s.g.netPort, nil
}

func (s *guest) NetProbe(ctx context.Context, port uint32, nonce []byte) ([]byte, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	switch {
	case s.g.LoopbackDown:
		return nil, fmt.Errorf("net probe: connect: network is unreachable: %w", errdefs.ErrUnavailable)
	case s.g.netPort == 0 || port != s.g.netPort:
		return nil, fmt.Errorf("net probe: connect: connection refused: %w", errdefs.ErrUnavailable)
	}
	return wire.ProofMAC(s.g.netValue, nonce), nil
}

func (s *guest) FrameHash(ctx context.Context, settle time.Duration) ([]byte, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if settle > 0 && s.g.painting != nil {
		s.g.frameHash, s.g.painting = s.g.painting, nil
	}
	if s.g.animating {
		next := sha256.Sum256(s.g.frameHash)
		s.g.frameHash = next[:16]
	}
	return append([]byte(nil), s.g.frameHash...), nil
}

func (s *guest) PutFile(ctx context.Context, path string, data []byte, _ uint32) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	s.g.SetFile(path, append([]byte(nil), data...))
	return nil
}

func (s *guest) GetFile(ctx context.Context, path string) ([]byte, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	b, ok := s.g.files[path]
	if !ok {
		return nil, fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
	}
	return b, nil
}

func (s *guest) Restored(ctx context.Context, r fleet.RestoredInfo) (fleet.RestoredResult, error) {
	if err := s.check(ctx); err != nil {
		return fleet.RestoredResult{}, err
	}
	if r.Token == "" || r.AdminToken == "" {
		return fleet.RestoredResult{}, errdefs.InvalidField("restored.token", "both tokens are required")
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	// As guestd: the checkpoint's tokens of both roles are refused from now on.
	s.g.sandboxID, s.g.aciToken, s.g.adminToken, s.g.generation = r.SandboxID, r.Token, r.AdminToken, r.Generation
	s.g.entropy = r.Entropy
	s.g.restored++
	s.g.appsHeld = r.HoldApps
	// The replica's first frame: the screen as the checkpoint left it (the
	// real guestd captures it under the X server grab the dump carried).
	// Then the grab goes and the apps finish a paint the dump caught.
	born := append([]byte(nil), s.g.frameHash...)
	if s.g.painting != nil {
		s.g.frameHash, s.g.painting = s.g.painting, nil
	}
	return fleet.RestoredResult{FrameHash: born}, nil
}

// CheckpointPrepare hashes the frame at once, as guestd does under the X
// server grab: a paint in flight is not waited for.
func (s *guest) CheckpointPrepare(ctx context.Context, _, _ time.Duration) ([]byte, error) {
	return s.FrameHash(ctx, 0)
}

func (s *guest) CheckpointDone(ctx context.Context) error { return s.check(ctx) }

func (s *guest) ReleaseScratch(ctx context.Context) error { return s.check(ctx) }

func (s *guest) ResumeApps(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	s.g.mu.Lock()
	s.g.appsResumed = s.g.appsResumed || s.g.appsHeld
	s.g.appsHeld = false
	s.g.mu.Unlock()
	return nil
}

func (s *guest) Ping(ctx context.Context) error { return s.check(ctx) }

func (s *guest) Hello() fleet.GuestHello { return s.hello }

func (s *guest) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}
