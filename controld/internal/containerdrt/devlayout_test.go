package containerdrt

import (
	"context"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestCheckDevEntries checks what a checkpoint (an imported one's too) may
// say of its /dev: no entries without the layout, only template names, each
// once, every required one.
func TestCheckDevEntries(t *testing.T) {
	all := []string{"fd", "full", "mqueue", "null", "ptmx", "pts", "random", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}
	for _, tc := range []struct {
		layout string
		names  []string
		ok     bool
	}{
		{"", nil, true},
		{"", []string{"null"}, false},
		{"tar", nil, false},
		{devLayoutBind, all, true},
		{devLayoutBind, append([]string{"shm", "core"}, all...), true},
		{devLayoutBind, append([]string{"passwd"}, all...), false},
		{devLayoutBind, append([]string{"../etc"}, all...), false},
		{devLayoutBind, append([]string{"null"}, all...), false},
		{devLayoutBind, all[1:], false},
	} {
		if err := checkDevEntries(tc.layout, tc.names); (err == nil) != tc.ok {
			t.Errorf("%q %q: %v", tc.layout, tc.names, err)
		}
		m := checkpointMeta{RunLayout: runLayoutRootfs, NetworkMode: "none", DevLayout: tc.layout, DevEntries: tc.names}
		if err := m.checkLayout(); (err == nil) != tc.ok {
			t.Errorf("checkLayout %q %q: %v", tc.layout, tc.names, err)
		}
	}
}

// TestWithDevBind checks that a replica's spec binds its /dev in place of
// the tmpfs, and refuses a spec without one.
func TestWithDevBind(t *testing.T) {
	s := &specs.Spec{Mounts: []specs.Mount{{Destination: "/proc"}, {Destination: "/dev", Type: "tmpfs"}, {Destination: "/dev/pts"}}}
	if err := withDevBind("/run/forkfleet/dev/x/dev")(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if m := s.Mounts[1]; m.Destination != "/dev" || m.Type != "bind" || m.Source != "/run/forkfleet/dev/x/dev" || s.Mounts[2].Destination != "/dev/pts" {
		t.Errorf("mounts %+v", s.Mounts)
	}
	if err := withDevBind("/x")(context.Background(), nil, nil, &specs.Spec{}); err == nil {
		t.Error("a spec without /dev: no error")
	}
}
