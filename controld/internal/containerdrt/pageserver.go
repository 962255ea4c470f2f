//go:build linux

package containerdrt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/lazypages"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// lazyPagesServer is controld's own page server (controld/internal/
// lazypages), the runtime's unless Config.PageServer names another. With
// hotDir, a checkpoint's working set is persisted there (hotSetFile), so a
// controld restart does not relearn it; metrics counts its reads and writes.
type lazyPagesServer struct {
	hotDir  string
	log     *slog.Logger
	metrics *hotSetMetrics
}

func (s lazyPagesServer) Open(dir string) (PageImages, error) {
	im, err := lazypages.Open(dir)
	if err != nil {
		return nil, err
	}
	if s.hotDir != "" {
		path := hotSetFile(s.hotDir, dir)
		err := im.KeepHot(path, s.log, s.metrics.wrote)
		s.metrics.read(im.HotPages(), err)
		if err != nil {
			s.log.Warn("persisted hot set ignored: the checkpoint's lazy replicas learn it again", "images", dir, "reason", hotSetReason(err), "err", err)
		} else if n := im.HotPages(); n > 0 {
			s.log.Info("persisted hot set loaded", "images", dir, "pages", n)
		}
	}
	return lazyPagesImages{im}, nil
}

// hotSetReason is why KeepHot ignored a persisted hot set
// (lazypages.HotSetReason), "unknown" for another error.
func hotSetReason(err error) string {
	if he := (*lazypages.HotSetError)(nil); errors.As(err, &he) {
		return string(he.Reason)
	}
	return "unknown"
}

// Results of a hot set's read (hotSetMetrics.reads) beside the reasons a
// file is ignored (lazypages.HotSetReason).
const (
	hotReadLoaded = "loaded" // read back: the checkpoint's next lazy fork copies it ahead of faults
	hotReadAbsent = "absent" // no file (or an empty set): learned at the next lazy fork
)

// hotSetMetrics count the page server's persisted hot sets: reads (one per
// checkpoint whose images are opened after a start, or after a delete gave
// up) and writes. A nil *hotSetMetrics counts nothing.
type hotSetMetrics struct {
	reads  *prometheus.CounterVec // result: loaded, absent, or a HotSetReason
	writes *prometheus.CounterVec // result: written, failed
}

func newHotSetMetrics() *hotSetMetrics {
	m := &hotSetMetrics{
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "lazy_hot_set_reads_total",
			Help: "Persisted lazy restore working sets (hot sets) read when a checkpoint's images are first opened after a start, by result: loaded, absent (learned again), or why the file was ignored and removed (unreadable, too_large, truncated, format, version, checksum, mismatch, stray_pages).",
		}, []string{"result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "lazy_hot_set_writes_total",
			Help: "Writes of a checkpoint's persisted lazy restore working set (hot set), by result: written, failed (kept in memory, written again at its next change).",
		}, []string{"result"}),
	}
	// Every series from the start, at 0.
	for _, r := range []string{hotReadLoaded, hotReadAbsent, string(lazypages.HotSetUnreadable), string(lazypages.HotSetTooLarge),
		string(lazypages.HotSetTruncated), string(lazypages.HotSetFormat), string(lazypages.HotSetVersion),
		string(lazypages.HotSetChecksum), string(lazypages.HotSetMismatch), string(lazypages.HotSetStrayPages)} {
		m.reads.WithLabelValues(r)
	}
	m.writes.WithLabelValues("written")
	m.writes.WithLabelValues("failed")
	return m
}

// read counts one KeepHot: its error, else whether it loaded pages.
func (m *hotSetMetrics) read(pages int64, err error) {
	if m == nil {
		return
	}
	switch {
	case err != nil:
		m.reads.WithLabelValues(hotSetReason(err)).Inc()
	case pages > 0:
		m.reads.WithLabelValues(hotReadLoaded).Inc()
	default:
		m.reads.WithLabelValues(hotReadAbsent).Inc()
	}
}

// wrote counts one write of a hot set file (KeepHot's callback).
func (m *hotSetMetrics) wrote(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.writes.WithLabelValues("failed").Inc()
		return
	}
	m.writes.WithLabelValues("written").Inc()
}

// Describe and Collect make the Runtime a prometheus.Collector of its own
// instruments (the page server's hot sets, the freezes retried), which
// controld registers.
func (r *Runtime) Describe(ch chan<- *prometheus.Desc) {
	if r.hotMetrics != nil {
		r.hotMetrics.reads.Describe(ch)
		r.hotMetrics.writes.Describe(ch)
	}
	if r.freezeRetries != nil {
		r.freezeRetries.Describe(ch)
	}
}

func (r *Runtime) Collect(ch chan<- prometheus.Metric) {
	if r.hotMetrics != nil {
		r.hotMetrics.reads.Collect(ch)
		r.hotMetrics.writes.Collect(ch)
	}
	if r.freezeRetries != nil {
		r.freezeRetries.Collect(ch)
	}
}

// LazyForked says whether ref's checkpoint has a persisted hot set: a lazy
// replica of it was verified before (this controld run or an earlier one).
// The fleet makes such a checkpoint's fork slots for lazy restores at
// start. Only the file's presence counts: its content is checked when the
// images are opened.
func (r *Runtime) LazyForked(ref runtime.CheckpointRef) bool {
	if _, ok := r.cfg.PageServer.(lazyPagesServer); !ok || ref.Dir == "" {
		return false
	}
	_, err := os.Lstat(hotSetFile(hotSetDir(r.cfg.StateDir), filepath.Join(ref.Dir, criuImageDir)))
	return err == nil
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
