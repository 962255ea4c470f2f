//go:build linux

package containerdrt

import (
	"context"
	"fmt"
	"net"

	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

var _ runtime.Networker = (*Runtime)(nil)

// SetNetworkPolicy replaces a sandbox's network policy.
func (r *Runtime) SetNetworkPolicy(ctx context.Context, id string, p network.Policy) error {
	if err := validateID(id); err != nil {
		return err
	}
	return r.net.SetPolicy(ctx, id, p)
}

// ConnectNetwork applies p and releases a held sandbox network.
func (r *Runtime) ConnectNetwork(ctx context.Context, id string, p network.Policy) error {
	if err := validateID(id); err != nil {
		return err
	}
	return r.net.Connect(ctx, id, p)
}

// EgressUnavailable says why mode egress cannot be set up here.
func (r *Runtime) EgressUnavailable() error { return r.net.EgressError() }

// DialPort connects to a TCP port inside a sandbox's network namespace.
func (r *Runtime) DialPort(ctx context.Context, id string, port uint16) (net.Conn, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	return r.net.DialPort(ctx, id, port)
}

// PruneNetworks releases the networks of sandboxes that have no container
// in the runtime's namespace (a crash between a network's setup and its
// container, or a container removed behind controld's back).
func (r *Runtime) PruneNetworks(ctx context.Context) error {
	ctx = r.ctx(ctx)
	cs, err := r.client.ContainerService().List(ctx)
	if err != nil {
		return fmt.Errorf("list containers: %w", convertErr(err))
	}
	have := make(map[string]bool, len(cs))
	for _, c := range cs {
		have[c.ID] = true
	}
	r.mu.Lock()
	for id := range r.precreated {
		have[id] = true // reserved ones are being created right now
	}
	r.mu.Unlock()
	return r.net.Prune(ctx, func(id string) bool { return have[id] })
}
