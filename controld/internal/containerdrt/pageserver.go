//go:build linux

package containerdrt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/lazypages"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// lazyPagesServer is controld's own page server (controld/internal/
// lazypages), the runtime's unless Config.PageServer names another. With
// hotDir, a checkpoint's working set is persisted there (hotSetFile), so a
// controld restart does not relearn it.
type lazyPagesServer struct {
	hotDir string
	log    *slog.Logger
}

func (s lazyPagesServer) Open(dir string) (PageImages, error) {
	im, err := lazypages.Open(dir)
	if err != nil {
		return nil, err
	}
	if s.hotDir != "" {
		path := hotSetFile(s.hotDir, dir)
		if err := im.KeepHot(path, s.log); err != nil {
			reason := "unknown"
			if he := (*lazypages.HotSetError)(nil); errors.As(err, &he) {
				reason = string(he.Reason)
			}
			s.log.Warn("persisted hot set ignored: the checkpoint's lazy replicas learn it again", "images", dir, "reason", reason, "err", err)
		} else if n := im.HotPages(); n > 0 {
			s.log.Info("persisted hot set loaded", "images", dir, "pages", n)
		}
	}
	return lazyPagesImages{im}, nil
}

// hotSetDir is where, under Config.StateDir, checkpoints' hot sets are
// persisted: controld's own directory, which no sandbox and no checkpoint
// image can write into.
func hotSetDir(stateDir string) string { return filepath.Join(stateDir, "hotsets") }

// hotSetFile is the file of the hot set of the checkpoint whose CRIU images
// are imagesDir: the checkpoint directory's name (for people) and a hash of
// the images' path (unique).
func hotSetFile(hotDir, imagesDir string) string {
	sum := sha256.Sum256([]byte(imagesDir))
	name := filepath.Base(filepath.Dir(imagesDir))
	if len(name) > 64 {
		name = name[:64]
	}
	return filepath.Join(hotDir, name+"-"+hex.EncodeToString(sum[:8])+".hot")
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

// removeHotSet removes the persisted hot set of the checkpoint in dir, as
// DeleteCheckpoint's step once its images are closed (their last write
// done): none outlives its checkpoint.
func (r *Runtime) removeHotSet(dir string) error {
	if err := lazypages.RemoveHot(hotSetFile(hotSetDir(r.cfg.StateDir), filepath.Join(dir, criuImageDir))); err != nil {
		return fmt.Errorf("checkpoint %s: %w: %w", dir, errdefs.ErrInternal, err)
	}
	return nil
}
