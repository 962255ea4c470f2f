package fleettest

import (
	"context"
	"fmt"
	"net"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

var _ runtime.Networker = (*Runtime)(nil)

// NetState is what the fake runtime knows of a sandbox's network.
type NetState struct {
	Spec      runtime.NetworkSpec // as booted or restored
	Policy    network.Policy      // the current policy
	Connected bool                // not held (or connected since)
}

// Net returns a sandbox's network state.
func (r *Runtime) Net(id string) (NetState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return NetState{}, false
	}
	return in.net, true
}

// ServePort makes DialPort(id, port) reach addr (a listener of the test).
func (r *Runtime) ServePort(id string, port uint16, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ports == nil {
		r.ports = map[string]string{}
	}
	r.ports[fmt.Sprintf("%s:%d", id, port)] = addr
}

// SetNetworkPolicy implements runtime.Networker.
func (r *Runtime) SetNetworkPolicy(_ context.Context, id string, p network.Policy) error {
	r.count("set_policy")
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	in.net.Policy = p
	return nil
}

// ConnectNetwork implements runtime.Networker.
func (r *Runtime) ConnectNetwork(_ context.Context, id string, p network.Policy) error {
	r.count("connect")
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	in.net.Policy, in.net.Connected = p, true
	return nil
}

// DialPort implements runtime.Networker: the address ServePort registered.
func (r *Runtime) DialPort(ctx context.Context, id string, port uint16) (net.Conn, error) {
	r.mu.Lock()
	addr, ok := r.ports[fmt.Sprintf("%s:%d", id, port)]
	r.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("sandbox %s: nothing on port %d: %w", id, port, errdefs.ErrUnavailable)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// PruneNetworks implements runtime.Networker (the fake keeps no networks
// apart from its sandboxes).
func (r *Runtime) PruneNetworks(context.Context) error { r.count("prune_networks"); return nil }

// EgressUnavailable implements runtime.Networker; NoEgress makes it refuse.
func (r *Runtime) EgressUnavailable() error {
	if r.NoEgress {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "EGRESS_UNAVAILABLE", "fake runtime without egress")
	}
	return nil
}
