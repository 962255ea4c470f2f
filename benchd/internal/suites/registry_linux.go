//go:build linux

package suites

import "github.com/forkfleet/forkfleet/benchd/internal/suiteapi"

// The order of `benchd run --suite all` and `benchd list`: cheap host-only
// suites first, then the controld lifecycle, then streaming.
func init() {
	for _, s := range []suiteapi.Suite{
		&actionSuite{}, &codecSuite{}, &stepSuite{}, &dedupSuite{}, &clientScale{},
		&bootSuite{}, &fanoutSuite{}, &checkpointSuite{}, &forkSuite{}, &poolSuite{}, &networkSuite{}, &browserSuite{},
		&remoteSuite{}, &lazyRestartSuite{}, &a11ySuite{}, &legibilitySuite{}, &screencastSuite{}, &guestCPUSuite{}, &viewSuite{}, &recordSuite{},
	} {
		suiteapi.Register(s)
	}
}
