//go:build linux

package suites

import (
	"sort"
	"strings"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

// forkBreakdown collects where a verified replica's time went, as controld
// reports it: the milestones of its waterfall (ms since the request reached
// controld: create, task_start, guestd_listening, usable) and how long each
// proof took. Only verified replicas contribute, like every timing row.
type forkBreakdown struct {
	tier, n string
	extra   []string // more labels for every row
	phases  map[string]*result.Series
	proofs  map[string]*result.Series
}

func newForkBreakdown(tier, n string, extra ...string) *forkBreakdown {
	return &forkBreakdown{tier: tier, n: n, extra: extra, phases: map[string]*result.Series{}, proofs: map[string]*result.Series{}}
}

func (b *forkBreakdown) labels(kv ...string) map[string]string {
	return labels(append(append([]string{"tier", b.tier, "n", b.n}, kv...), b.extra...)...)
}

func (b *forkBreakdown) add(rep *controldv1.ForkReplica) {
	for _, p := range rep.GetSandbox().GetBoot() {
		s, ok := b.phases[p.GetName()]
		if !ok {
			s = result.NewSeries("fork.replica_phase_at", "ms", b.labels("phase", p.GetName()))
			b.phases[p.GetName()] = s
		}
		s.Add(dur(p.GetAt()))
	}
	for _, v := range rep.GetVerification() {
		name := strings.ToLower(strings.TrimPrefix(v.GetLevel().String(), "VERIFY_LEVEL_"))
		s, ok := b.proofs[name]
		if !ok {
			s = result.NewSeries("fork.replica_proof", "ms", b.labels("level", name))
			b.proofs[name] = s
		}
		s.Add(dur(v.GetTook()))
	}
}

// rows returns the breakdown, phases in waterfall order (by median offset)
// then proofs by name.
func (b *forkBreakdown) rows() []result.Row {
	var phases, proofs []result.Row
	for _, s := range b.phases {
		phases = append(phases, s.Row())
	}
	for _, s := range b.proofs {
		proofs = append(proofs, s.Row())
	}
	sort.Slice(phases, func(i, j int) bool { return p50(phases[i]) < p50(phases[j]) })
	sort.Slice(proofs, func(i, j int) bool { return proofs[i].Labels["level"] < proofs[j].Labels["level"] })
	return append(phases, proofs...)
}

func p50(r result.Row) float64 {
	if r.P50 == nil {
		return 0
	}
	return *r.P50
}
