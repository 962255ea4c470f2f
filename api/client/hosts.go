package client

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
)

// Many hosts (controld/docs/hosts.md): a Client from DialHosts talks to
// several controlds at once. New sandboxes, pools and imports go to the
// host with the most room (GetHostStatus, asked before each placement);
// every later call for a sandbox, checkpoint or pool goes to the host that
// owns it, which the client learns from the records it receives (their host
// field) or, for an id it has not seen, by asking every host. It only ever
// sends to the endpoints it was given or that its DNS names resolve to: a
// record's host field selects among them and never names an address.

// ReasonHostUnreachable is the ErrorInfo reason of an ErrUnavailable error
// saying that the host owning a sandbox, checkpoint or pool (or one of the
// hosts a list or lookup needs) does not answer.
const ReasonHostUnreachable = "HOST_UNREACHABLE"

// ReasonAmbiguousName: a checkpoint or pool name names records on more
// than one host (names are unique per host only); use the id.
const ReasonAmbiguousName = "NAME_ON_MANY_HOSTS"

// ResolveInterval is how often a client of many hosts resolves its dns:///
// targets again (a Kubernetes headless Service's pods come and go); a
// lookup of an unknown id or a lost route resolves at once.
const ResolveInterval = 30 * time.Second

// hostStatusTimeout bounds the status round before a placement: a host that
// does not answer in time is left out of it.
const hostStatusTimeout = 3 * time.Second

// DialHosts returns a Client of several controlds. Each target is a
// controld address as for Dial ("host:port", "unix:///path") or
// "dns:///name:port": every address name resolves to, one controld each
// (a Kubernetes headless Service), resolved again every ResolveInterval.
// Options apply to every host (one token, one TLS configuration; TLS
// verifies a resolved address against name). Like Dial, connections are
// made lazily.
func DialHosts(ctx context.Context, targets []string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(targets) == 0 {
		return nil, errdefs.InvalidField("targets", "at least one controld address")
	}
	o, err := newDialOptions(opts)
	if err != nil {
		return nil, err
	}
	r := &router{o: o, targets: slices.Clone(targets), endpoints: map[string]*endpoint{}, owners: map[string]string{},
		placed: map[string]string{}, pushed: map[string]string{}, lookup: o.lookupHost}
	if r.lookup == nil {
		r.lookup = net.DefaultResolver.LookupHost
	}
	for _, t := range targets {
		if _, _, ok := dnsTarget(t); !ok {
			if _, err := isLocalTarget(t); err != nil {
				return nil, err
			}
		}
	}
	if err := r.resolve(ctx); err != nil {
		r.Close()
		return nil, errgrpc.FromGRPC(err)
	}
	c := newFromConn(r, o.sessionOptions()...)
	c.router = r
	c.gatewayTLS = o.tls
	return c, nil
}

// HostState is one host's answer to GetHostStatus in Client.Hosts.
type HostState struct {
	// Target is the address the client reaches the host at.
	Target string
	Status *controldv1.GetHostStatusResponse
	// Err is set (an errdefs class) when the host did not answer.
	Err error
}

// Hosts reports every host of the client (one for a client from Dial),
// in the order of their targets.
func (c *Client) Hosts(ctx context.Context) ([]HostState, error) {
	if c.router == nil {
		st, err := c.HostStatus(ctx)
		if err != nil {
			return nil, err
		}
		return []HostState{{Target: c.conn.Target(), Status: st}}, nil
	}
	if err := c.router.maybeResolve(ctx); err != nil {
		return nil, convert(ctx, err)
	}
	var out []HostState
	for _, s := range c.router.statuses(ctx) {
		out = append(out, HostState{Target: s.ep.target, Status: s.st, Err: convertMaybe(ctx, s.err)})
	}
	return out, nil
}

func convertMaybe(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	return convert(ctx, err)
}

// dnsTarget splits "dns:///name:port" (or "dns:name:port").
func dnsTarget(t string) (name, port string, ok bool) {
	rest, ok := strings.CutPrefix(t, "dns:")
	if !ok {
		return "", "", false
	}
	rest = strings.TrimPrefix(rest, "///")
	name, port, err := net.SplitHostPort(rest)
	if err != nil || name == "" {
		return "", "", false
	}
	return name, port, true
}

// endpoint is one controld of a client of many hosts.
type endpoint struct {
	target string // the address dialed
	conn   *grpc.ClientConn
	local  bool // a unix socket: the client runs on this host
	// serverName is the DNS name the address was resolved from: what TLS
	// verifies, for the API and the host's ACI gateway.
	serverName string
	host       string
}

// router is a grpc.ClientConnInterface over the endpoints: the generated
// service clients (and so every Client method) run through it.
type router struct {
	o       *dialOptions
	targets []string
	lookup  func(ctx context.Context, host string) ([]string, error)

	mu         sync.Mutex
	endpoints  map[string]*endpoint // by target
	order      []string             // targets in the order given and resolved
	owners     map[string]string    // record id -> host name
	placed     map[string]string    // request id of a placed call -> host name
	pushed     map[string]string    // checkpoint id -> its image in the registry, by digest
	resolvedAt time.Time
	closed     bool
}

var _ grpc.ClientConnInterface = (*router)(nil)

// resolve (re)builds the endpoint set from the targets: new addresses are
// dialed, vanished ones closed.
func (r *router) resolve(ctx context.Context) error {
	type addr struct{ target, serverName string }
	var want []addr
	for _, t := range r.targets {
		name, port, ok := dnsTarget(t)
		if !ok {
			want = append(want, addr{target: t})
			continue
		}
		ips, err := r.lookup(ctx, name)
		if err != nil {
			return errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrUnavailable, ReasonHostUnreachable,
				"resolve %s: %v", name, err))
		}
		slices.Sort(ips)
		for _, ip := range ips {
			want = append(want, addr{target: net.JoinHostPort(ip, port), serverName: name})
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrFailedPrecondition, "CLIENT_CLOSED", "client closed"))
	}
	keep := map[string]bool{}
	var order []string
	for _, a := range want {
		if keep[a.target] {
			continue
		}
		keep[a.target] = true
		order = append(order, a.target)
		if r.endpoints[a.target] != nil {
			continue
		}
		conn, err := r.o.connect(a.target, a.serverName)
		if err != nil {
			return err
		}
		r.endpoints[a.target] = &endpoint{target: a.target, conn: conn, local: strings.HasPrefix(a.target, "unix"), serverName: a.serverName}
	}
	for t, ep := range r.endpoints {
		if !keep[t] {
			ep.conn.Close()
			delete(r.endpoints, t)
		}
	}
	r.order = order
	r.resolvedAt = time.Now()
	return nil
}

// maybeResolve resolves again when the last resolution is older than
// ResolveInterval (and there is a DNS target at all).
func (r *router) maybeResolve(ctx context.Context) error {
	r.mu.Lock()
	stale := time.Since(r.resolvedAt) > ResolveInterval
	r.mu.Unlock()
	if !stale || !r.hasDNS() {
		return nil
	}
	return r.resolve(ctx)
}

func (r *router) hasDNS() bool {
	for _, t := range r.targets {
		if _, _, ok := dnsTarget(t); ok {
			return true
		}
	}
	return false
}

// list returns the endpoints in order, one per host: a host reached at two
// addresses (it reported the same name on both) counts once.
func (r *router) list() []*endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	var out []*endpoint
	for _, t := range r.order {
		ep := r.endpoints[t]
		if ep.host != "" {
			if seen[ep.host] {
				continue
			}
			seen[ep.host] = true
		}
		out = append(out, ep)
	}
	return out
}

// byHostLocked is the endpoint of host name, nil when none reports it.
func (r *router) byHostLocked(host string) *endpoint {
	if host == "" {
		return nil
	}
	for _, t := range r.order {
		if ep := r.endpoints[t]; ep.host == host {
			return ep
		}
	}
	return nil
}

// Close closes every endpoint's connection.
func (r *router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for t, ep := range r.endpoints {
		ep.conn.Close()
		delete(r.endpoints, t)
	}
	r.order = nil
	return nil
}

// hostStatus is one host's answer in a status round.
type hostStatus struct {
	ep  *endpoint
	st  *controldv1.GetHostStatusResponse
	err error
}

// statuses asks every host for its status at once, and learns their names.
func (r *router) statuses(ctx context.Context) []hostStatus {
	eps := r.list()
	out := make([]hostStatus, len(eps))
	ctx, cancel := context.WithTimeout(ctx, hostStatusTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			st := &controldv1.GetHostStatusResponse{}
			err := ep.conn.Invoke(ctx, controldv1.HostService_GetHostStatus_FullMethodName, &controldv1.GetHostStatusRequest{}, st)
			out[i] = hostStatus{ep: ep, err: err}
			if err == nil {
				out[i].st = st
				r.nameHost(ep, st.GetHost())
			}
		})
	}
	wg.Wait()
	return out
}

// nameHost records the host name an endpoint answered with.
func (r *router) nameHost(ep *endpoint, host string) {
	if host == "" {
		return
	}
	r.mu.Lock()
	ep.host = host
	r.mu.Unlock()
}

// placement picks the hosts of n new sandboxes of memBytes each (0: each
// host's default) by the hosts' reported room (Spread).
func (r *router) placement(ctx context.Context, memBytes int64, n int) ([]*endpoint, error) {
	if err := r.maybeResolve(ctx); err != nil {
		return nil, err
	}
	all := r.statuses(ctx)
	var up []hostStatus
	var down []string
	for _, s := range all {
		if s.err != nil {
			down = append(down, fmt.Sprintf("%s (%v)", s.ep.target, status.Convert(s.err).Message()))
			continue
		}
		up = append(up, s)
	}
	if len(up) == 0 {
		return nil, errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrUnavailable, ReasonHostUnreachable,
			"no host answered its status: %s", strings.Join(down, "; ")))
	}
	sts := make([]*controldv1.GetHostStatusResponse, len(up))
	for i, s := range up {
		sts[i] = s.st
	}
	out := make([]*endpoint, n)
	for i, h := range Spread(sts, memBytes, n) {
		out[i] = up[h].ep
	}
	return out, nil
}

// Spread assigns n new sandboxes of memBytes each (0: a host's default
// memory) to hosts by their status: each goes to the host with the most room
// left, counting the ones already assigned, where room is the lesser of the
// memory admission leaves (max_memory_bytes - admitted_memory_bytes) and
// the memory the kernel reports available. A host without a sandbox slot
// or admission memory for one more is passed over while another has both;
// when none has, the one with the most admission room gets it (and answers
// RESOURCE_EXHAUSTED, HOST_AT_CAPACITY, as it would alone). Ties go to the
// host with fewer assigned, then the earlier one. It returns an index into
// hosts per sandbox.
func Spread(hosts []*controldv1.GetHostStatusResponse, memBytes int64, n int) []int {
	assigned := make([]int, len(hosts))
	used := make([]int64, len(hosts))
	out := make([]int, 0, n)
	for range n {
		best, bestRoom, bestFits := -1, int64(0), false
		for i, h := range hosts {
			need := memBytes
			if need <= 0 {
				need = h.GetDefaultMemoryBytes()
			}
			admission := h.GetMaxMemoryBytes() - h.GetAdmittedMemoryBytes() - used[i]
			room := min(admission, h.GetMemoryAvailableBytes()-used[i])
			fits := int64(h.GetSandboxes())+int64(assigned[i]) < int64(h.GetMaxSandboxes()) && admission >= need
			if !fits {
				room = admission
			}
			better := best < 0 || fits && !bestFits ||
				fits == bestFits && (room > bestRoom || room == bestRoom && assigned[i] < assigned[best])
			if better {
				best, bestRoom, bestFits = i, room, fits
			}
		}
		need := memBytes
		if need <= 0 {
			need = hosts[best].GetDefaultMemoryBytes()
		}
		assigned[best]++
		used[best] += need
		out = append(out, best)
	}
	return out
}

// Invoke routes one unary call.
func (r *router) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	req, ok := args.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "client: %T is not a proto message", args)
	}
	if ep, ok := ctx.Value(pinKey{}).(*endpoint); ok {
		return r.call(ctx, ep, routingKey(req), method, req, reply, opts)
	}
	switch method {
	case controldv1.SandboxService_ListSandboxes_FullMethodName, controldv1.CheckpointService_ListCheckpoints_FullMethodName,
		controldv1.PoolService_ListPools_FullMethodName, controldv1.SandboxService_ListRecordings_FullMethodName:
		return r.listAll(ctx, method, req, reply.(proto.Message), opts)
	case controldv1.HostService_GetHostStatus_FullMethodName:
		eps := r.list()
		if len(eps) == 0 {
			return r.noHosts()
		}
		return r.call(ctx, eps[0], "", method, req, reply, opts)
	}
	key := routingKey(req)
	if key == "" {
		return r.place(ctx, method, req, reply, opts)
	}
	ep, err := r.owner(ctx, method, key)
	if err != nil {
		return err
	}
	return r.call(ctx, ep, key, method, req, reply, opts)
}

// maxOwners bounds the record ids whose host a client remembers.
const maxOwners = 1 << 20

// maxPlaced bounds the request ids whose host a client remembers.
const maxPlaced = 1 << 16

// place runs a call that creates a record from nothing of a host's
// (CreateSandbox, ImportCheckpoint, an image pool) on the host with the most
// room. A repeat of a request id this client placed goes to the same host,
// which returns the first call's result.
func (r *router) place(ctx context.Context, method string, req proto.Message, reply any, opts []grpc.CallOption) error {
	reqID := ""
	if fd := req.ProtoReflect().Descriptor().Fields().ByName("request_id"); fd != nil {
		reqID = req.ProtoReflect().Get(fd).String()
	}
	if reqID != "" {
		r.mu.Lock()
		ep := r.byHostLocked(r.placed[reqID])
		r.mu.Unlock()
		if ep != nil {
			return r.call(ctx, ep, "", method, req, reply, opts)
		}
	}
	eps, err := r.placement(ctx, memoryOf(req), 1)
	if err != nil {
		return err
	}
	if reqID != "" {
		r.mu.Lock()
		if len(r.placed) >= maxPlaced {
			clear(r.placed)
		}
		if eps[0].host != "" {
			r.placed[reqID] = eps[0].host
		}
		r.mu.Unlock()
	}
	return r.call(ctx, eps[0], "", method, req, reply, opts)
}

func (r *router) noHosts() error {
	return errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrUnavailable, ReasonHostUnreachable, "no controld endpoints (the DNS names resolved to none)"))
}

// call runs one call on ep and learns the owners of the records it returns;
// key is the record the call is routed by ("" for a placement).
func (r *router) call(ctx context.Context, ep *endpoint, key, method string, req proto.Message, reply any, opts []grpc.CallOption) error {
	err := ep.conn.Invoke(ctx, method, req, reply, opts...)
	if err != nil {
		return r.hostErr(ctx, ep, key, err)
	}
	// Routes outlive deletes: a repeated delete goes to the owner, which
	// remembers the id.
	r.learn(ep, reply.(proto.Message))
	return nil
}

// hostErr turns a host's UNAVAILABLE without a reason of controld's own
// (gRPC's: the connection failed, after its retries) into
// ReasonHostUnreachable naming the host and what it holds.
func (r *router) hostErr(ctx context.Context, ep *endpoint, key string, err error) error {
	if status.Code(err) != codes.Unavailable || ctx.Err() != nil || errdefs.Reason(errgrpc.FromGRPC(err)) != "" {
		return err
	}
	r.mu.Lock()
	host := ep.host
	r.mu.Unlock()
	what := ""
	if key != "" {
		what = ", which holds " + key + ","
	}
	return errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrUnavailable, ReasonHostUnreachable,
		"host %s at %s%s is unreachable: %s", cmp.Or(host, "?"), ep.target, what, status.Convert(err).Message()))
}

// routingKey is the record a request is about: its id, sandbox_id,
// checkpoint_id or pool_id ("" for a request that creates a record from
// nothing of a host's: a sandbox, an image pool, an import).
func routingKey(m proto.Message) string {
	fields := m.ProtoReflect().Descriptor().Fields()
	for _, name := range []protoreflect.Name{"id", "sandbox_id", "checkpoint_id", "pool_id"} {
		fd := fields.ByName(name)
		if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
			continue
		}
		if v := m.ProtoReflect().Get(fd).String(); v != "" {
			return v
		}
	}
	return ""
}

// memoryOf is the memory a creating request asks for per sandbox times its
// sandboxes (a pool's size); 0 when it leaves it to the host.
func memoryOf(m proto.Message) int64 {
	pr := m.ProtoReflect()
	fd := pr.Descriptor().Fields().ByName("resources")
	if fd == nil || fd.Message() == nil || fd.Message().FullName() != "forkfleet.controld.v1.Resources" || !pr.Has(fd) {
		return 0
	}
	mem := pr.Get(fd).Message().Interface().(*controldv1.Resources).GetMemoryBytes()
	if sz := pr.Descriptor().Fields().ByName("size"); sz != nil && sz.Kind() == protoreflect.Uint32Kind {
		mem *= int64(max(1, pr.Get(sz).Uint()))
	}
	return mem
}

// kindOf says which Get call finds key: by the id's prefix, else (a name)
// by the service of method.
func kindOf(method, key string) string {
	switch {
	case strings.HasPrefix(key, rules.PrefixSandbox):
		return "sandbox"
	case strings.HasPrefix(key, rules.PrefixCheckpoint):
		return "checkpoint"
	case strings.HasPrefix(key, rules.PrefixPool):
		return "pool"
	case strings.HasPrefix(key, rules.PrefixRecording):
		return "recording"
	case strings.Contains(method, ".CheckpointService/"):
		return "checkpoint"
	case strings.Contains(method, ".PoolService/"):
		return "pool"
	}
	return "sandbox"
}

// owner is the endpoint of the host holding key: known from an earlier
// answer, or found by asking every host.
func (r *router) owner(ctx context.Context, method, key string) (*endpoint, error) {
	r.mu.Lock()
	host, known := r.owners[key]
	ep := r.byHostLocked(host)
	r.mu.Unlock()
	if ep != nil {
		return ep, nil
	}
	if known {
		// Its host left the endpoint set (a pod gone from the Service):
		// resolve once more before calling it lost.
		if r.hasDNS() {
			if err := r.resolve(ctx); err != nil {
				return nil, err
			}
			r.statuses(ctx)
			r.mu.Lock()
			ep = r.byHostLocked(host)
			r.mu.Unlock()
			if ep != nil {
				return ep, nil
			}
		}
		return nil, errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrUnavailable, ReasonHostUnreachable,
			"%s is on host %s, which none of the client's controld endpoints reaches now", key, host))
	}
	ep, err := r.locate(ctx, method, key)
	if err != nil && r.hasDNS() && (status.Code(err) == codes.NotFound || status.Code(err) == codes.Unavailable) {
		// Maybe on a pod the names did not resolve to yet.
		if rerr := r.resolve(ctx); rerr != nil {
			return nil, rerr
		}
		return r.locate(ctx, method, key)
	}
	return ep, err
}

// locate asks every host for key (its Get call) and routes to the one that
// has it.
func (r *router) locate(ctx context.Context, method, key string) (*endpoint, error) {
	if err := r.maybeResolve(ctx); err != nil {
		return nil, err
	}
	eps := r.list()
	if len(eps) == 0 {
		return nil, r.noHosts()
	}
	var getMethod string
	var newReq func() proto.Message
	var newResp func() proto.Message
	switch kind := kindOf(method, key); kind {
	case "checkpoint":
		getMethod = controldv1.CheckpointService_GetCheckpoint_FullMethodName
		newReq = func() proto.Message { return &controldv1.GetCheckpointRequest{Id: key} }
		newResp = func() proto.Message { return &controldv1.GetCheckpointResponse{} }
	case "pool":
		getMethod = controldv1.PoolService_GetPool_FullMethodName
		newReq = func() proto.Message { return &controldv1.GetPoolRequest{Id: key} }
		newResp = func() proto.Message { return &controldv1.GetPoolResponse{} }
	case "recording":
		getMethod = controldv1.SandboxService_GetRecording_FullMethodName
		newReq = func() proto.Message { return &controldv1.GetRecordingRequest{Id: key} }
		newResp = func() proto.Message { return &controldv1.GetRecordingResponse{} }
	default:
		getMethod = controldv1.SandboxService_GetSandbox_FullMethodName
		newReq = func() proto.Message { return &controldv1.GetSandboxRequest{Id: key} }
		newResp = func() proto.Message { return &controldv1.GetSandboxResponse{} }
	}
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			resp := newResp()
			errs[i] = ep.conn.Invoke(ctx, getMethod, newReq(), resp)
			if errs[i] == nil {
				r.learn(ep, resp)
			}
		})
	}
	wg.Wait()
	var found []*endpoint
	var down []string
	var notFound, other error
	for i, err := range errs {
		switch {
		case err == nil:
			found = append(found, eps[i])
		case status.Code(err) == codes.NotFound:
			notFound = err
		case status.Code(err) == codes.Unavailable:
			down = append(down, eps[i].target)
		case other == nil:
			other = err
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		var hosts []string
		for _, ep := range found {
			hosts = append(hosts, ep.target)
		}
		return nil, errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrFailedPrecondition, ReasonAmbiguousName,
			"%q names records on %d hosts (%s); use its id", key, len(found), strings.Join(hosts, ", ")))
	case other != nil:
		return nil, other
	case len(down) > 0:
		return nil, errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrUnavailable, ReasonHostUnreachable,
			"%s is on none of the hosts that answered, and %s did not answer", key, strings.Join(down, ", ")))
	}
	return nil, notFound
}

// learn records the owner of every sandbox, checkpoint and pool in m, an
// answer of ep. Endpoints of sandboxes on another host lose their unix
// path: a pid there names some other process here.
func (r *router) learn(ep *endpoint, m proto.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.walkLocked(ep, m.ProtoReflect(), 0)
}

func (r *router) walkLocked(ep *endpoint, m protoreflect.Message, depth int) {
	if depth > 3 {
		return
	}
	switch m.Descriptor().FullName() {
	case "forkfleet.controld.v1.Sandbox", "forkfleet.controld.v1.Checkpoint", "forkfleet.controld.v1.Pool", "forkfleet.controld.v1.Recording":
		fields := m.Descriptor().Fields()
		id := m.Get(fields.ByName("id")).String()
		host := ""
		if fd := fields.ByName("host"); fd != nil { // a recording is on its sandbox's host
			host = m.Get(fd).String()
		}
		if host == "" {
			host = ep.host
		}
		if ep.host == "" {
			ep.host = host
		}
		if isID(id) && host != "" {
			if len(r.owners) >= maxOwners {
				clear(r.owners) // an id not known is looked up again
			}
			r.owners[id] = host
		}
		return
	case "forkfleet.controld.v1.Endpoint":
		if !ep.local {
			e := m.Interface().(*controldv1.Endpoint)
			e.UnixPath, e.UnixPidStart = "", 0
		}
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil || fd.IsMap() {
			return true
		}
		if fd.IsList() {
			l := v.List()
			for i := range l.Len() {
				r.walkLocked(ep, l.Get(i).Message(), depth+1)
			}
			return true
		}
		r.walkLocked(ep, v.Message(), depth+1)
		return true
	})
}

// listAll runs a List call on every host and merges the pages: items
// oldest first (pools by id), at most page_size from each host, and a
// next_page_token carrying each host's own.
func (r *router) listAll(ctx context.Context, method string, req, reply proto.Message, opts []grpc.CallOption) error {
	fields := req.ProtoReflect().Descriptor().Fields()
	tokFD := fields.ByName("page_token")
	var tokens map[string]string // host (or target) -> its token
	if t := req.ProtoReflect().Get(tokFD).String(); t != "" {
		var err error
		if tokens, err = decodeHostsToken(t); err != nil {
			return errgrpc.ToGRPC(err)
		}
	} else if err := r.maybeResolve(ctx); err != nil {
		return err
	}
	eps := r.list()
	if len(eps) == 0 {
		return r.noHosts()
	}
	if len(eps) > 0 {
		r.statusesIfUnnamed(ctx, eps)
	}
	type part struct {
		ep   *endpoint
		key  string
		tok  string
		resp proto.Message
		err  error
	}
	var parts []*part
	r.mu.Lock()
	for _, ep := range eps {
		key := cmp.Or(ep.host, ep.target)
		if tokens != nil {
			tok, ok := tokens[key]
			if !ok {
				continue
			}
			delete(tokens, key)
			parts = append(parts, &part{ep: ep, key: key, tok: tok})
			continue
		}
		parts = append(parts, &part{ep: ep, key: key})
	}
	r.mu.Unlock()
	for key := range tokens {
		return errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrUnavailable, ReasonHostUnreachable,
			"the rest of this list is on host %s, which none of the client's controld endpoints reaches now", key))
	}
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(func() {
			sub := proto.Clone(req)
			sub.ProtoReflect().Set(tokFD, protoreflect.ValueOfString(p.tok))
			p.resp = reply.ProtoReflect().New().Interface()
			p.err = p.ep.conn.Invoke(ctx, method, sub, p.resp, opts...)
			if p.err != nil {
				p.err = r.hostErr(ctx, p.ep, "", p.err)
			} else {
				r.learn(p.ep, p.resp)
			}
		})
	}
	wg.Wait()
	rd := reply.ProtoReflect().Descriptor()
	var itemsFD protoreflect.FieldDescriptor
	for i := range rd.Fields().Len() {
		if fd := rd.Fields().Get(i); fd.IsList() && fd.Message() != nil {
			itemsFD = fd
		}
	}
	nextFD := rd.Fields().ByName("next_page_token")
	merged := reply.ProtoReflect().New()
	items := merged.Mutable(itemsFD).List()
	next := map[string]string{}
	for _, p := range parts {
		if p.err != nil {
			return p.err
		}
		l := p.resp.ProtoReflect().Get(itemsFD).List()
		for i := range l.Len() {
			items.Append(l.Get(i))
		}
		if t := p.resp.ProtoReflect().Get(nextFD).String(); t != "" {
			next[p.key] = t
		}
	}
	all := make([]protoreflect.Message, items.Len())
	for i := range all {
		all[i] = items.Get(i).Message()
	}
	slices.SortStableFunc(all, compareRecords)
	items.Truncate(0)
	for _, m := range all {
		items.Append(protoreflect.ValueOfMessage(m))
	}
	if len(next) > 0 {
		merged.Set(nextFD, protoreflect.ValueOfString(encodeHostsToken(next)))
	}
	proto.Reset(reply)
	proto.Merge(reply, merged.Interface())
	return nil
}

// statusesIfUnnamed asks for the statuses when an endpoint's host name is
// not known yet (list tokens are keyed by host).
func (r *router) statusesIfUnnamed(ctx context.Context, eps []*endpoint) {
	r.mu.Lock()
	unnamed := false
	for _, ep := range eps {
		unnamed = unnamed || ep.host == ""
	}
	r.mu.Unlock()
	if unnamed {
		r.statuses(ctx)
	}
}

// compareRecords orders merged list items as one controld does: by
// created_at then id (pools, which have no created_at: by id).
func compareRecords(a, b protoreflect.Message) int {
	fd := a.Descriptor().Fields().ByName("created_at")
	if fd == nil {
		fd = a.Descriptor().Fields().ByName("started_at") // recordings
	}
	if fd != nil {
		ta, tb := a.Get(fd).Message(), b.Get(fd).Message()
		secs, nanos := ta.Descriptor().Fields().ByName("seconds"), ta.Descriptor().Fields().ByName("nanos")
		if c := cmp.Compare(ta.Get(secs).Int(), tb.Get(secs).Int()); c != 0 {
			return c
		}
		if c := cmp.Compare(ta.Get(nanos).Int(), tb.Get(nanos).Int()); c != 0 {
			return c
		}
	}
	id := a.Descriptor().Fields().ByName("id")
	return strings.Compare(a.Get(id).String(), b.Get(id).String())
}

// hostsTokenPrefix starts the page tokens of a client of many hosts.
const hostsTokenPrefix = "hosts."

func encodeHostsToken(m map[string]string) string {
	b, _ := json.Marshal(m)
	return hostsTokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func decodeHostsToken(t string) (map[string]string, error) {
	bad := errdefs.InvalidField("page_token", "not a next_page_token of this client's hosts")
	rest, ok := strings.CutPrefix(t, hostsTokenPrefix)
	if !ok {
		return nil, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return nil, bad
	}
	var m map[string]string
	if json.Unmarshal(b, &m) != nil || len(m) == 0 {
		return nil, bad
	}
	return m, nil
}

// NewStream serves WatchSandboxes, the API's one stream: the same watch on
// every host, merged.
func (r *router) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := r.maybeResolve(ctx); err != nil {
		return nil, err
	}
	eps := r.list()
	if len(eps) == 0 {
		return nil, r.noHosts()
	}
	ctx, cancel := context.WithCancel(ctx)
	fs := &fanStream{ctx: ctx, cancel: cancel, r: r, msgs: make(chan fanMsg)}
	for _, ep := range eps {
		s, err := ep.conn.NewStream(ctx, desc, method, opts...)
		if err != nil {
			cancel()
			return nil, r.hostErr(ctx, ep, "", err)
		}
		fs.streams = append(fs.streams, s)
		fs.eps = append(fs.eps, ep)
	}
	return fs, nil
}

// gatewayTLS is the TLS configuration for the gateway of the host holding
// id (a sandbox or a recording): the client's, verifying the DNS name the
// host was resolved from (a pod's gateway URL names its address); nil when
// the client has no TLS configuration or the host was given by address.
func (r *router) gatewayTLS(id string) *tls.Config {
	if r.o.tls == nil || r.o.tls.ServerName != "" {
		return nil
	}
	r.mu.Lock()
	ep := r.byHostLocked(r.owners[id])
	r.mu.Unlock()
	if ep == nil || ep.serverName == "" {
		return nil
	}
	cfg := r.o.tls.Clone()
	cfg.ServerName = ep.serverName
	return cfg
}

// isID reports whether s is a sandbox, checkpoint or pool id (names are
// never cached: a name may move to another host).
func isID(s string) bool {
	return rules.ValidID(rules.PrefixSandbox, s) || rules.ValidID(rules.PrefixCheckpoint, s) || rules.ValidID(rules.PrefixPool, s) ||
		rules.ValidID(rules.PrefixRecording, s)
}

// fanStream is one server stream per host merged into one: what is sent
// goes to all, what is received comes from any. It ends when every host's
// stream has ended, or with the first host's error (ReasonHostUnreachable
// when a host is lost), which cancels the others.
type fanStream struct {
	ctx     context.Context
	cancel  context.CancelFunc
	r       *router
	streams []grpc.ClientStream
	eps     []*endpoint
	once    sync.Once
	msgs    chan fanMsg
	done    int
}

type fanMsg struct {
	m   proto.Message
	err error // io.EOF: that host's stream ended
	ep  *endpoint
}

func (f *fanStream) SendMsg(m any) error {
	for i, s := range f.streams {
		if err := s.SendMsg(m); err != nil {
			f.cancel()
			return f.r.hostErr(f.ctx, f.eps[i], "", err)
		}
	}
	return nil
}

func (f *fanStream) CloseSend() error {
	for _, s := range f.streams {
		if err := s.CloseSend(); err != nil {
			f.cancel()
			return err
		}
	}
	return nil
}

func (f *fanStream) RecvMsg(m any) error {
	pm := m.(proto.Message)
	f.once.Do(func() {
		mt := pm.ProtoReflect().Type()
		for i, s := range f.streams {
			go func() {
				for {
					msg := mt.New().Interface()
					err := s.RecvMsg(msg)
					if err != nil {
						msg = nil
					}
					select {
					case f.msgs <- fanMsg{m: msg, err: err, ep: f.eps[i]}:
					case <-f.ctx.Done():
						return
					}
					if err != nil {
						return
					}
				}
			}()
		}
	})
	for {
		select {
		case <-f.ctx.Done():
			return status.FromContextError(f.ctx.Err()).Err()
		case got := <-f.msgs:
			if got.err == nil {
				f.r.learn(got.ep, got.m)
				proto.Reset(pm)
				proto.Merge(pm, got.m)
				return nil
			}
			if got.err == io.EOF {
				if f.done++; f.done == len(f.streams) {
					f.cancel()
					return io.EOF
				}
				continue
			}
			f.cancel()
			return f.r.hostErr(context.Background(), got.ep, "", got.err)
		}
	}
}

func (f *fanStream) Header() (metadata.MD, error) { return f.streams[0].Header() }
func (f *fanStream) Trailer() metadata.MD         { return f.streams[0].Trailer() }
func (f *fanStream) Context() context.Context     { return f.ctx }

// pinKey marks a context whose calls go to one endpoint (a share of a fork
// spread over hosts).
type pinKey struct{}

// forkAcross forks n replicas of ck over the hosts with room (Spread, by
// the replicas' memory): the checkpoint's host forks its share from ck, the
// others from its image in the registry (WithCheckpointRegistry), all at
// once. A host whose share fails as a whole (unreachable, a pull refused)
// fails each of its replicas with that error, as a replica's own failure
// would; an invalid request fails the call.
func (c *Client) forkAcross(ctx context.Context, ck *Checkpoint, n int, opts []ForkOption) ([]ForkResult, error) {
	r := c.router
	info, err := ck.Get(ctx)
	if err != nil {
		return nil, err
	}
	probe := &controldv1.ForkCheckpointRequest{}
	for _, o := range opts {
		o.applyFork(probe)
	}
	mem := probe.GetResources().GetMemoryBytes()
	if mem == 0 {
		mem = info.GetResources().GetMemoryBytes()
	}
	placed, err := r.placement(ctx, mem, n)
	if err != nil {
		return nil, convert(ctx, err)
	}
	r.mu.Lock()
	owner := r.byHostLocked(info.GetHost())
	r.mu.Unlock()
	type share struct {
		ep    *endpoint
		count int
		res   []ForkResult
		err   error
	}
	var shares []*share
	byEP := map[*endpoint]*share{}
	for _, ep := range placed {
		if byEP[ep] == nil {
			byEP[ep] = &share{ep: ep}
			shares = append(shares, byEP[ep])
		}
		byEP[ep].count++
	}
	// The checkpoint's own host first: its replicas need no pull.
	slices.SortStableFunc(shares, func(a, b *share) int {
		return cmp.Compare(boolInt(b.ep == owner), boolInt(a.ep == owner))
	})
	ref := ""
	if len(shares) > 1 || shares[0].ep != owner {
		if ref, err = c.pushCheckpoint(ctx, c.Checkpoint(info.GetId())); err != nil {
			return nil, err
		}
	}
	var wg sync.WaitGroup
	for i, sh := range shares {
		wg.Go(func() {
			req := &controldv1.ForkCheckpointRequest{Count: uint32(sh.count)}
			for _, o := range opts {
				o.applyFork(req)
			}
			if sh.ep == owner {
				req.CheckpointId = info.GetId()
			} else {
				req.CheckpointReference = ref
			}
			if req.RequestId != "" && len(shares) > 1 {
				// One request id per host's share: a repeat of the whole
				// fork repeats each share.
				req.RequestId = fmt.Sprintf("%s:%d", req.RequestId, i)
			}
			sh.res, _, sh.err = c.fork(context.WithValue(ctx, pinKey{}, sh.ep), req, nil)
		})
	}
	wg.Wait()
	var out []ForkResult
	for _, sh := range shares {
		if sh.err != nil {
			if errors.Is(sh.err, errdefs.ErrInvalidArgument) {
				return nil, sh.err
			}
			for range sh.count {
				// As controld reports a failed replica.
				out = append(out, ForkResult{Err: sh.err, Replica: &controldv1.ForkReplica{
					ErrorCode: int32(errgrpc.Code(sh.err)), ErrorMessage: sh.err.Error()}})
			}
			continue
		}
		out = append(out, sh.res...)
	}
	return out, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// pushCheckpoint pushes ck to the client's registry once (its host exports
// it, tagged with its id) and returns its reference by digest, which every
// other host pulls and verifies.
func (c *Client) pushCheckpoint(ctx context.Context, ck *Checkpoint) (string, error) {
	r := c.router
	r.mu.Lock()
	ref, ok := r.pushed[ck.id]
	r.mu.Unlock()
	if ok {
		return ref, nil
	}
	repo := r.o.registry
	exp, err := ck.Export(ctx, repo+":"+ck.id, WithPush())
	if err != nil {
		return "", err
	}
	ref = repo + "@" + exp.GetDigest()
	r.mu.Lock()
	if len(r.pushed) >= maxPlaced {
		clear(r.pushed)
	}
	r.pushed[ck.id] = ref
	r.mu.Unlock()
	return ref, nil
}
