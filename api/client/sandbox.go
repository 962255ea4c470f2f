package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
)

// Sandbox is a handle on one sandbox. It caches the last state and endpoint
// controld returned; methods refresh them.
type Sandbox struct {
	c  *Client
	id string

	mu       sync.Mutex
	info     *controldv1.Sandbox
	endpoint *controldv1.Endpoint
}

// Sandbox returns a handle on sandbox id without contacting controld.
func (c *Client) Sandbox(id string) *Sandbox { return &Sandbox{c: c, id: id} }

func (c *Client) sandboxFrom(info *controldv1.Sandbox, ep *controldv1.Endpoint) *Sandbox {
	return &Sandbox{c: c, id: info.GetId(), info: info, endpoint: ep}
}

// ID is the sandbox id ("sb-...").
func (sb *Sandbox) ID() string { return sb.id }

// Info returns the last known state (nil before any RPC returned it).
func (sb *Sandbox) Info() *controldv1.Sandbox {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.info
}

func (sb *Sandbox) set(info *controldv1.Sandbox) {
	if info == nil {
		return
	}
	sb.mu.Lock()
	sb.info = info
	sb.mu.Unlock()
}

// CreateSandbox boots a sandbox.
func (c *Client) CreateSandbox(ctx context.Context, opts ...CreateOption) (*Sandbox, error) {
	req := &controldv1.CreateSandboxRequest{}
	for _, o := range opts {
		o.applyCreate(req)
	}
	r, err := c.sandboxes.CreateSandbox(ctx, req)
	if err != nil {
		return nil, convert(ctx, err)
	}
	return c.sandboxFrom(r.GetSandbox(), r.GetEndpoint()), nil
}

// GetSandbox fetches a sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	sb := c.Sandbox(id)
	if _, err := sb.Get(ctx); err != nil {
		return nil, err
	}
	return sb, nil
}

// ListSandboxes lists every matching sandbox, oldest first (filter
// WithLabels, WithStates), following the pages.
func (c *Client) ListSandboxes(ctx context.Context, opts ...ListOption) ([]*controldv1.Sandbox, error) {
	return allPages(func(token string) ([]*controldv1.Sandbox, string, error) {
		return c.ListSandboxesPage(ctx, token, opts...)
	})
}

// ListSandboxesPage returns one page (WithPageSize) from pageToken ("":
// the first) and the next page's token ("" after the last).
func (c *Client) ListSandboxesPage(ctx context.Context, pageToken string, opts ...ListOption) ([]*controldv1.Sandbox, string, error) {
	req := &controldv1.ListSandboxesRequest{PageToken: pageToken}
	for _, o := range opts {
		o.applyList(req)
	}
	r, err := c.sandboxes.ListSandboxes(ctx, req)
	if err != nil {
		return nil, "", convert(ctx, err)
	}
	return r.GetSandboxes(), r.GetNextPageToken(), nil
}

// allPages collects the items of every page.
func allPages[T any](page func(token string) ([]T, string, error)) ([]T, error) {
	var out []T
	token := ""
	for {
		items, next, err := page(token)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" {
			return out, nil
		}
		token = next
	}
}

// Extend sets when the sandbox is deleted: ttl from now (longer or shorter
// than before).
func (sb *Sandbox) Extend(ctx context.Context, ttl time.Duration) error {
	r, err := sb.c.sandboxes.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: sb.id, Ttl: durationpb.New(ttl)})
	if err != nil {
		return convert(ctx, err)
	}
	sb.set(r.GetSandbox())
	return nil
}

// Get refreshes and returns the sandbox's state.
func (sb *Sandbox) Get(ctx context.Context) (*controldv1.Sandbox, error) {
	r, err := sb.c.sandboxes.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: sb.id})
	if err != nil {
		return nil, convert(ctx, err)
	}
	sb.set(r.GetSandbox())
	return r.GetSandbox(), nil
}

// WaitReady returns once the sandbox is usable (WithTimeout bounds the wait
// server-side; ctx bounds it client-side).
func (sb *Sandbox) WaitReady(ctx context.Context, opts ...WaitOption) (*controldv1.Sandbox, error) {
	req := &controldv1.WaitSandboxReadyRequest{Id: sb.id}
	for _, o := range opts {
		o.applyWait(req)
	}
	r, err := sb.c.sandboxes.WaitSandboxReady(ctx, req)
	if err != nil {
		return nil, convert(ctx, err)
	}
	sb.set(r.GetSandbox())
	return r.GetSandbox(), nil
}

// Delete removes the sandbox.
func (sb *Sandbox) Delete(ctx context.Context) error {
	_, err := sb.c.sandboxes.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: sb.id})
	return convert(ctx, err)
}

// Suspend freezes every process of the sandbox.
func (sb *Sandbox) Suspend(ctx context.Context) error {
	r, err := sb.c.sandboxes.SuspendSandbox(ctx, &controldv1.SuspendSandboxRequest{Id: sb.id})
	if err != nil {
		return convert(ctx, err)
	}
	sb.set(r.GetSandbox())
	return nil
}

// Resume thaws a suspended sandbox.
func (sb *Sandbox) Resume(ctx context.Context) error {
	r, err := sb.c.sandboxes.ResumeSandbox(ctx, &controldv1.ResumeSandboxRequest{Id: sb.id})
	if err != nil {
		return convert(ctx, err)
	}
	sb.set(r.GetSandbox())
	return nil
}

// Verify runs the fork verifiers on a forked sandbox (all levels its
// checkpoint supports when none are given).
func (sb *Sandbox) Verify(ctx context.Context, levels ...controldv1.VerifyLevel) ([]*controldv1.VerifyResult, error) {
	r, err := sb.c.sandboxes.VerifySandbox(ctx, &controldv1.VerifySandboxRequest{Id: sb.id, Levels: levels})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return r.GetResults(), nil
}

// Endpoint returns how to reach the sandbox's ACI: the one controld returned
// with the sandbox, or a fresh one from GetSandboxEndpoint.
func (sb *Sandbox) Endpoint(ctx context.Context) (*controldv1.Endpoint, error) {
	sb.mu.Lock()
	ep := sb.endpoint
	sb.mu.Unlock()
	if ep != nil {
		return ep, nil
	}
	return sb.RefreshEndpoint(ctx)
}

// RefreshEndpoint fetches the endpoint from controld (a restored replica
// has a new token).
func (sb *Sandbox) RefreshEndpoint(ctx context.Context) (*controldv1.Endpoint, error) {
	r, err := sb.c.sandboxes.GetSandboxEndpoint(ctx, &controldv1.GetSandboxEndpointRequest{Id: sb.id})
	if err != nil {
		return nil, convert(ctx, err)
	}
	sb.mu.Lock()
	sb.endpoint = r.GetEndpoint()
	sb.mu.Unlock()
	return r.GetEndpoint(), nil
}

// ACIOption configures Sandbox.ACI.
type ACIOption func(*aciConfig)

type aciConfig struct {
	via  aciRoute
	opts []aci.DialOption
}

type aciRoute int

const (
	routeAuto    aciRoute = iota // unix socket when reachable, else gateway
	routeGateway                 // always the gateway URL
	routeUnix                    // only the unix socket
)

// ViaGateway always dials controld's ACI gateway URL.
func ViaGateway() ACIOption { return func(c *aciConfig) { c.via = routeGateway } }

// ViaUnix dials only guestd's unix socket (fails when it is not reachable
// from this process).
func ViaUnix() ACIOption { return func(c *aciConfig) { c.via = routeUnix } }

// WithDialOptions passes ACI dial options (after the client's own).
func WithDialOptions(opts ...aci.DialOption) ACIOption {
	return func(c *aciConfig) { c.opts = append(c.opts, opts...) }
}

// ACI opens an ACI session to the sandbox: directly over guestd's unix
// socket when this process can reach it (same host, permissions), else
// through controld's gateway. The session fetches a fresh token from
// controld whenever it redials (aci.WithReconnect), so it follows a restore.
func (sb *Sandbox) ACI(ctx context.Context, opts ...ACIOption) (*aci.Session, error) {
	var cfg aciConfig
	for _, o := range opts {
		o(&cfg)
	}
	ep, err := sb.Endpoint(ctx)
	if err != nil {
		return nil, err
	}
	// The first dial uses the token in hand; every redial asks controld.
	var redial atomic.Bool
	tokenSource := func(ctx context.Context) (string, error) {
		if !redial.Swap(true) {
			return ep.GetToken(), nil
		}
		fresh, err := sb.RefreshEndpoint(ctx)
		if err != nil {
			return "", err
		}
		return fresh.GetToken(), nil
	}
	dialOpts := append([]aci.DialOption(nil), sb.c.aciOpts...)
	if sb.c.router != nil {
		if t := sb.c.router.gatewayTLS(sb.id); t != nil {
			dialOpts = append(dialOpts, aci.WithTLSConfig(t))
		}
	}
	dialOpts = append(append(dialOpts, cfg.opts...), aci.WithTokenSource(tokenSource))

	var unixErr error
	if cfg.via != routeGateway && ep.GetUnixPath() != "" {
		addr, err := guestsock.Parse(ep.GetUnixPath(), ep.GetUnixPidStart())
		switch {
		case err != nil:
			unixErr = fmt.Errorf("client: sandbox %s: unix endpoint: %w", sb.id, err)
			if cfg.via == routeUnix {
				return nil, unixErr
			}
		default:
			// Straight to the session: a socket this process cannot reach
			// (not root, another host or pid namespace, the sandbox gone)
			// fails the dial at once, and the gateway is tried next. A
			// probe's connection first cost guestd an accept and the
			// claim to usable path a connect (0.2 to 0.4 ms).
			s, err := aci.DialSandbox(ctx, addr, ep.GetToken(), dialOpts...)
			if err == nil || cfg.via == routeUnix || ctx.Err() != nil {
				return s, err
			}
			unixErr = err
			redial.Store(false)
		}
	}
	if cfg.via == routeUnix {
		return nil, fmt.Errorf("client: sandbox %s: %w: no unix ACI endpoint", sb.id, errdefs.ErrFailedPrecondition)
	}
	if ep.GetUrl() == "" {
		if unixErr != nil {
			return nil, unixErr
		}
		return nil, fmt.Errorf("client: sandbox %s: %w: controld returned no ACI endpoint", sb.id, errdefs.ErrFailedPrecondition)
	}
	return aci.Dial(ctx, ep.GetUrl(), ep.GetToken(), dialOpts...)
}

// gatewayTLS is the TLS configuration for HTTPS to the gateway of the
// sandbox's host (exposed ports): the client's, verifying a DNS-resolved
// host against its name (client of many hosts).
func (sb *Sandbox) gatewayTLS() *tls.Config { return sb.c.gatewayTLSOf(sb.id) }

// gatewayTLSOf is the TLS configuration for the gateway of the host holding
// id (a sandbox or a recording).
func (c *Client) gatewayTLSOf(id string) *tls.Config {
	if c.router != nil {
		if t := c.router.gatewayTLS(id); t != nil {
			return t
		}
	}
	return c.gatewayTLS
}

// Event is one sandbox lifecycle event from Watch.
type Event = controldv1.WatchSandboxesResponse

// Watch streams sandbox lifecycle events, starting with an EXISTING event
// per matching sandbox. Iteration ends when ctx is done (without an error)
// or the stream fails (the error is yielded once, converted).
//
//	for ev, err := range c.Watch(ctx, client.WithLabels(l)) { ... }
func (c *Client) Watch(ctx context.Context, opts ...WatchOption) iter.Seq2[*Event, error] {
	req := &controldv1.WatchSandboxesRequest{}
	for _, o := range opts {
		o.applyWatch(req)
	}
	return func(yield func(*Event, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // ends the stream when the consumer breaks out
		stream, err := c.sandboxes.WatchSandboxes(ctx, req)
		if err != nil {
			if ctx.Err() == nil {
				yield(nil, convert(ctx, err))
			}
			return
		}
		for {
			ev, err := stream.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, io.EOF) {
					// controld ended the stream (shutting down): watch again.
					err = fmt.Errorf("client: watch ended by controld: %w", errdefs.ErrUnavailable)
				} else {
					err = convert(ctx, err)
				}
				yield(nil, err)
				return
			}
			if !yield(ev, nil) {
				return
			}
		}
	}
}

// Checkpoint captures the running sandbox (memory tier by default).
func (sb *Sandbox) Checkpoint(ctx context.Context, opts ...CheckpointOption) (*Checkpoint, error) {
	req := &controldv1.CreateCheckpointRequest{SandboxId: sb.id}
	for _, o := range opts {
		o.applyCheckpoint(req)
	}
	r, err := sb.c.checkpoints.CreateCheckpoint(ctx, req)
	if err != nil {
		return nil, convert(ctx, err)
	}
	return &Checkpoint{c: sb.c, id: r.GetCheckpoint().GetId(), info: r.GetCheckpoint()}, nil
}

// Checkpoint is a handle on one checkpoint.
type Checkpoint struct {
	c  *Client
	id string

	mu   sync.Mutex
	info *controldv1.Checkpoint
}

// Checkpoint returns a handle on checkpoint id (or name) without contacting
// controld.
func (c *Client) Checkpoint(id string) *Checkpoint { return &Checkpoint{c: c, id: id} }

// ID is the checkpoint id as given or returned by controld.
func (ck *Checkpoint) ID() string { return ck.id }

// Info returns the last known state (nil before any RPC returned it).
func (ck *Checkpoint) Info() *controldv1.Checkpoint {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	return ck.info
}

// Get refreshes and returns the checkpoint.
func (ck *Checkpoint) Get(ctx context.Context) (*controldv1.Checkpoint, error) {
	r, err := ck.c.checkpoints.GetCheckpoint(ctx, &controldv1.GetCheckpointRequest{Id: ck.id})
	if err != nil {
		return nil, convert(ctx, err)
	}
	ck.mu.Lock()
	ck.info = r.GetCheckpoint()
	ck.mu.Unlock()
	return r.GetCheckpoint(), nil
}

// GetCheckpoint fetches a checkpoint by id or name.
func (c *Client) GetCheckpoint(ctx context.Context, idOrName string) (*Checkpoint, error) {
	ck := c.Checkpoint(idOrName)
	info, err := ck.Get(ctx)
	if err != nil {
		return nil, err
	}
	ck.id = info.GetId()
	return ck, nil
}

// ListCheckpoints lists every matching checkpoint, oldest first (filter
// WithLabels, WithRoot), following the pages.
func (c *Client) ListCheckpoints(ctx context.Context, opts ...ListCheckpointsOption) ([]*controldv1.Checkpoint, error) {
	return allPages(func(token string) ([]*controldv1.Checkpoint, string, error) {
		return c.ListCheckpointsPage(ctx, token, opts...)
	})
}

// ListCheckpointsPage returns one page from pageToken and the next page's
// token.
func (c *Client) ListCheckpointsPage(ctx context.Context, pageToken string, opts ...ListCheckpointsOption) ([]*controldv1.Checkpoint, string, error) {
	req := &controldv1.ListCheckpointsRequest{PageToken: pageToken}
	for _, o := range opts {
		o.applyListCheckpoints(req)
	}
	r, err := c.checkpoints.ListCheckpoints(ctx, req)
	if err != nil {
		return nil, "", convert(ctx, err)
	}
	return r.GetCheckpoints(), r.GetNextPageToken(), nil
}

// Delete removes the checkpoint; one with children is refused
// (errdefs.ErrFailedPrecondition) unless WithCascade. It returns the ids
// deleted.
func (ck *Checkpoint) Delete(ctx context.Context, opts ...DeleteCheckpointOption) ([]string, error) {
	req := &controldv1.DeleteCheckpointRequest{Id: ck.id}
	for _, o := range opts {
		o.applyDeleteCheckpoint(req)
	}
	r, err := ck.c.checkpoints.DeleteCheckpoint(ctx, req)
	if err != nil {
		return nil, convert(ctx, err)
	}
	return r.GetDeletedIds(), nil
}

// ForkResult is one replica's outcome.
type ForkResult struct {
	// Sandbox is set when the replica is usable (verified when asked).
	Sandbox *Sandbox
	// Err is set when this replica failed (errdefs classes apply).
	Err          error
	Verification []*controldv1.VerifyResult
	// Took is request to usable for this replica.
	Took time.Duration
	// Replica is controld's answer for this replica as received.
	Replica *controldv1.ForkReplica
}

// Fork starts n replicas of the checkpoint concurrently. The error is for
// the request as a whole; each replica's own failure is in its ForkResult.
func (ck *Checkpoint) Fork(ctx context.Context, n int, opts ...ForkOption) ([]ForkResult, error) {
	// The upper bound is controld's to enforce; this only keeps n in range
	// of the wire type.
	if n < 1 || n > 1<<20 {
		return nil, errdefs.InvalidField("count", "must be at least 1 (got %d)", n)
	}
	if r := ck.c.router; r != nil && r.o.registry != "" {
		return ck.c.forkAcross(ctx, ck, n, opts)
	}
	results, _, err := ck.c.fork(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.id, Count: uint32(n)}, opts)
	return results, err
}

// ForkRemote forks n replicas of the checkpoint image reference in an OCI
// registry (pushed by Export WithPush): controld pulls and imports it once
// per manifest digest and forks the local import, which it returns.
func (c *Client) ForkRemote(ctx context.Context, reference string, n int, opts ...ForkOption) ([]ForkResult, *Checkpoint, error) {
	if n < 1 || n > 1<<20 {
		return nil, nil, errdefs.InvalidField("count", "must be at least 1 (got %d)", n)
	}
	results, id, err := c.fork(ctx, &controldv1.ForkCheckpointRequest{CheckpointReference: reference, Count: uint32(n)}, opts)
	if err != nil {
		return nil, nil, err
	}
	return results, c.Checkpoint(id), nil
}

// fork sends a ForkCheckpoint request and returns its replicas and the
// local checkpoint forked.
func (c *Client) fork(ctx context.Context, req *controldv1.ForkCheckpointRequest, opts []ForkOption) ([]ForkResult, string, error) {
	for _, o := range opts {
		o.applyFork(req)
	}
	r, err := c.checkpoints.ForkCheckpoint(ctx, req)
	if err != nil {
		return nil, "", convert(ctx, err)
	}
	out := make([]ForkResult, len(r.GetReplicas()))
	for i, rep := range r.GetReplicas() {
		res := ForkResult{Verification: rep.GetVerification(), Took: rep.GetTook().AsDuration(), Replica: rep}
		if rep.GetErrorCode() != 0 {
			res.Err = replicaErr(rep)
		} else if rep.GetSandbox() != nil {
			res.Sandbox = c.sandboxFrom(rep.GetSandbox(), rep.GetEndpoint())
		} else {
			res.Err = fmt.Errorf("client: fork replica %d: %w: neither sandbox nor error", i, errdefs.ErrInternal)
		}
		out[i] = res
	}
	return out, r.GetCheckpointId(), nil
}

// Sandboxes returns the usable replicas of a fork.
func Sandboxes(results []ForkResult) []*Sandbox {
	var out []*Sandbox
	for _, r := range results {
		if r.Sandbox != nil {
			out = append(out, r.Sandbox)
		}
	}
	return out
}

// FirstError returns the first replica error of a fork, if any.
func FirstError(results []ForkResult) error {
	for i, r := range results {
		if r.Err != nil {
			return fmt.Errorf("replica %d: %w", i, r.Err)
		}
	}
	return nil
}

// Export writes the checkpoint as an OCI image named reference into
// controld's content store, and pushes it to its registry WithPush.
func (ck *Checkpoint) Export(ctx context.Context, reference string, opts ...ExportOption) (*controldv1.ExportCheckpointResponse, error) {
	req := &controldv1.ExportCheckpointRequest{Id: ck.id, Reference: reference}
	for _, o := range opts {
		o.applyExport(req)
	}
	r, err := ck.c.checkpoints.ExportCheckpoint(ctx, req)
	if err != nil {
		return nil, convert(ctx, err)
	}
	return r, nil
}

// ImportCheckpoint registers a checkpoint image written by Export, pulling
// it from its registry first WithPull.
func (c *Client) ImportCheckpoint(ctx context.Context, reference string, opts ...ImportOption) (*Checkpoint, error) {
	req := &controldv1.ImportCheckpointRequest{Reference: reference}
	for _, o := range opts {
		o.applyImport(req)
	}
	r, err := c.checkpoints.ImportCheckpoint(ctx, req)
	if err != nil {
		return nil, convert(ctx, err)
	}
	return &Checkpoint{c: c, id: r.GetCheckpoint().GetId(), info: r.GetCheckpoint()}, nil
}

// CreatePool creates a warm pool of size sandboxes from an image
// (WithImage) or a checkpoint (FromCheckpoint).
func (c *Client) CreatePool(ctx context.Context, name string, size int, opts ...PoolOption) (*controldv1.Pool, error) {
	if size < 1 || size > 1<<20 {
		return nil, errdefs.InvalidField("size", "must be at least 1 (got %d)", size)
	}
	req := &controldv1.CreatePoolRequest{Name: name, Size: uint32(size)}
	for _, o := range opts {
		o.applyPool(req)
	}
	r, err := c.pools.CreatePool(ctx, req)
	if err != nil {
		return nil, convert(ctx, err)
	}
	return r.GetPool(), nil
}

// GetPool fetches a pool (id or name).
func (c *Client) GetPool(ctx context.Context, id string) (*controldv1.Pool, error) {
	r, err := c.pools.GetPool(ctx, &controldv1.GetPoolRequest{Id: id})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return r.GetPool(), nil
}

// ListPools lists every pool (by id), following the pages.
func (c *Client) ListPools(ctx context.Context, opts ...ListPoolsOption) ([]*controldv1.Pool, error) {
	return allPages(func(token string) ([]*controldv1.Pool, string, error) { return c.ListPoolsPage(ctx, token, opts...) })
}

// ListPoolsPage returns one page from pageToken and the next page's token.
func (c *Client) ListPoolsPage(ctx context.Context, pageToken string, opts ...ListPoolsOption) ([]*controldv1.Pool, string, error) {
	req := &controldv1.ListPoolsRequest{PageToken: pageToken}
	for _, o := range opts {
		o.applyListPools(req)
	}
	r, err := c.pools.ListPools(ctx, req)
	if err != nil {
		return nil, "", convert(ctx, err)
	}
	return r.GetPools(), r.GetNextPageToken(), nil
}

// UpdatePool changes a pool's size (1..64): a larger pool fills up, a
// smaller one removes its warm members past the size.
func (c *Client) UpdatePool(ctx context.Context, id string, size int) (*controldv1.Pool, error) {
	if size < 1 || size > 1<<20 {
		return nil, errdefs.InvalidField("size", "must be at least 1 (got %d)", size)
	}
	r, err := c.pools.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: id, Size: uint32(size)})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return r.GetPool(), nil
}

// DeletePool deletes a pool and its warm sandboxes.
func (c *Client) DeletePool(ctx context.Context, id string) error {
	_, err := c.pools.DeletePool(ctx, &controldv1.DeletePoolRequest{Id: id})
	return convert(ctx, err)
}

// Claim is a sandbox handed out by a pool.
type Claim struct {
	Sandbox *Sandbox
	// Hit: served warm from the pool (false: booted or forked on demand).
	Hit  bool
	Took time.Duration
}

// ClaimPool takes a usable sandbox from a pool.
func (c *Client) ClaimPool(ctx context.Context, poolID string, opts ...ClaimOption) (*Claim, error) {
	req := &controldv1.ClaimPoolRequest{PoolId: poolID}
	for _, o := range opts {
		o.applyClaim(req)
	}
	r, err := c.pools.ClaimPool(ctx, req)
	if err != nil {
		return nil, convert(ctx, err)
	}
	return &Claim{Sandbox: c.sandboxFrom(r.GetSandbox(), r.GetEndpoint()), Hit: r.GetHit(), Took: r.GetTook().AsDuration()}, nil
}

// replicaErr turns a ForkReplica's error fields into an errdefs error.
func replicaErr(rep *controldv1.ForkReplica) error {
	return errgrpc.FromGRPC(status.Error(codes.Code(rep.GetErrorCode()), rep.GetErrorMessage()))
}
