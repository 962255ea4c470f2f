//go:build linux

package suites

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// A boot from a warm slot has its create milestone at 0 (controld created it
// ahead of the request); its rows must not pool with the cold boots'.
func TestBootStart(t *testing.T) {
	phase := func(name string, ms int) *controldv1.BootPhase {
		return &controldv1.BootPhase{Name: name, At: durationpb.New(time.Duration(ms) * time.Millisecond)}
	}
	for _, c := range []struct {
		phases []*controldv1.BootPhase
		want   string
	}{
		{[]*controldv1.BootPhase{phase("create", 0), phase("task_start", 9), phase("usable", 80)}, startWarmSlot},
		{[]*controldv1.BootPhase{phase("create", 12), phase("task_start", 98), phase("usable", 165)}, startCold},
		{[]*controldv1.BootPhase{phase("task_start", 0)}, startCold},
		{nil, startCold},
	} {
		if got := bootStart(c.phases); got != c.want {
			t.Errorf("bootStart(%v) = %s, want %s", c.phases, got, c.want)
		}
	}
}
