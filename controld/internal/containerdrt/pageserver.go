//go:build linux

package containerdrt

import (
	"context"

	"github.com/forkfleet/forkfleet/controld/internal/lazypages"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// lazyPagesServer is controld's own page server (controld/internal/
// lazypages), the runtime's unless Config.PageServer names another.
type lazyPagesServer struct{}

func (lazyPagesServer) Open(dir string) (PageImages, error) {
	im, err := lazypages.Open(dir)
	if err != nil {
		return nil, err
	}
	return lazyPagesImages{im}, nil
}

type lazyPagesImages struct{ *lazypages.Images }

func (im lazyPagesImages) Listen(ctx context.Context, work string) (PageSession, error) {
	s, err := lazypages.Listen(ctx, im.Images, work)
	if err != nil {
		return nil, err
	}
	return lazyPagesSession{s}, nil
}

type lazyPagesSession struct{ *lazypages.Session }

func (s lazyPagesSession) Stats() runtime.LazyStats {
	st := s.Session.Stats()
	return runtime.LazyStats{LazyPages: st.LazyPages, Faults: st.Faults, FaultPages: st.FaultPages, BackgroundPages: st.BackgroundPages,
		HotPages: st.HotPages, FirstFault: st.FirstFault, HotDone: st.HotDone, RestoreFinished: st.RestoreFinished}
}
