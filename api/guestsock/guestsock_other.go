//go:build !linux

package guestsock

import (
	"context"
	"fmt"
	"net"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// Dial needs Linux (openat2, /proc): sandboxes run on Linux hosts only, and
// a client elsewhere goes through controld's gateway.
func Dial(ctx context.Context, a Addr) (*net.UnixConn, error) {
	return nil, fmt.Errorf("guestsock: dial %s: %w: sandbox sockets are reachable from Linux hosts only", a, errdefs.ErrUnavailable)
}

// ProcessStart needs Linux's /proc.
func ProcessStart(pid uint32) (uint64, error) {
	return 0, fmt.Errorf("guestsock: pid %d: %w: no /proc here", pid, errdefs.ErrUnavailable)
}

// Self needs Linux's /proc.
func Self(path string) (Addr, error) {
	return Addr{}, fmt.Errorf("guestsock: %w: no /proc here", errdefs.ErrUnavailable)
}
