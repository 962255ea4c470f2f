//go:build linux

package x11_test

import (
	"github.com/forkfleet/forkfleet/guestd/internal/aci"
	"github.com/forkfleet/forkfleet/guestd/internal/x11"
)

var _ aci.Desktop = (*x11.Desktop)(nil)

var (
	_ aci.DamageSequencer = (*x11.Desktop)(nil)
	_ aci.FrameViewer     = (*x11.Desktop)(nil)
)

var _ aci.ScreenMirror = (*x11.Desktop)(nil)
