// Package recording records sandboxes on the host: the delta screencast
// that controld's gateway already shares among live viewers (one more
// consumer of the one capture per sandbox), and a JSONL trajectory of every
// ACI request through the gateway and its outcome, read from the bytes the
// gateway forwards. Everything is written by controld, under a directory
// it names (<state dir>/recordings/<rc-id>/), within a disk cap per
// recording and a floor of free space on the host; nothing in the path,
// the size or the content of a recording is chosen by the sandbox. Exports
// (export.go) render a stopped recording to MP4 through the host's ffmpeg
// or to PNG frames. controld/docs/recording.md has the formats.
package recording

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
)

// Source feeds recordings: controld's gateway (its shared screencast and
// its ACI route). Record starts feeding s for sandbox id; detach stops.
type Source interface {
	Record(sandboxID string, s Sink) (detach func())
}

// Options configure a Manager.
type Options struct {
	// Dir holds the recordings (created 0700).
	Dir string
	Log *slog.Logger
	// Floor is the free space a recording never takes from the host's
	// filesystem: writing stops (CAP_REACHED) below it. 1 GiB or 5% of
	// the filesystem, whichever is more, when 0.
	Floor uint64
	// FFmpeg is the ffmpeg binary for MP4 exports ("ffmpeg" on PATH when
	// empty).
	FFmpeg string
	// Routable reports whether a sandbox exists and can be recorded (its
	// error is returned as is: NOT_FOUND ...).
	Routable func(sandboxID string) error
	// Registerer, when set, gets the recorder's metrics (metrics.go).
	Registerer prometheus.Registerer
	// GatewayHost (host:port) and GatewayTLS make the download URLs of
	// recording tickets (download.go).
	GatewayHost string
	GatewayTLS  bool
}

// diskCheckEvery: the host's free space is checked after every this many
// bytes a recorder writes.
const diskCheckEvery = 8 << 20

// Manager owns the recordings of this controld. Safe for concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	source Source
	recs   map[string]*controldv1.Recording // every recording on disk, by id
	active map[string]*recorder             // by sandbox id
	byID   map[string]*recorder             // active, by recording id
	// exporting: recordings with an export running (not deleted meanwhile).
	exporting map[string]bool
	closed    bool
	metrics   metrics

	ticketMu sync.Mutex
	tickets  map[[sha256.Size]byte]recordingTicket // download tickets by SHA-256 (download.go)
}

// New opens the recordings under opts.Dir. Recordings that were running
// when controld stopped are marked stopped (CONTROLD_STOPPED): their files
// hold what was written until then.
func New(opts Options) (*Manager, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.FFmpeg == "" {
		opts.FFmpeg = "ffmpeg"
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("recording: %w", err)
	}
	m := &Manager{opts: opts, log: opts.Log, recs: map[string]*controldv1.Recording{}, active: map[string]*recorder{},
		byID: map[string]*recorder{}, exporting: map[string]bool{}}
	m.register(opts.Registerer)
	ents, err := os.ReadDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("recording: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() || !rules.ValidID(rules.PrefixRecording, e.Name()) {
			continue
		}
		rec, err := m.load(e.Name())
		if err != nil {
			m.log.Warn("recording: skipping an unreadable recording", "dir", e.Name(), "err", err)
			continue
		}
		m.recs[rec.GetId()] = rec
	}
	return m, nil
}

func (m *Manager) dir(id string) string { return filepath.Join(m.opts.Dir, id) }

// load reads a recording's record, finishing one that was running.
func (m *Manager) load(id string) (*controldv1.Recording, error) {
	b, err := os.ReadFile(filepath.Join(m.dir(id), MetaFile))
	if err != nil {
		return nil, err
	}
	rec := &controldv1.Recording{}
	if err := protojson.Unmarshal(b, rec); err != nil {
		return nil, err
	}
	if rec.GetId() != id {
		return nil, fmt.Errorf("its record names %q", rec.GetId())
	}
	rec.Dir = m.dir(id)
	rec.Bytes = dirBytes(rec.Dir)
	if rec.GetState() == controldv1.RecordingState_RECORDING_STATE_RECORDING {
		rec.State = controldv1.RecordingState_RECORDING_STATE_STOPPED
		rec.StopReason = controldv1.RecordingStopReason_RECORDING_STOP_REASON_CONTROLD_STOPPED
		rec.StoppedAt = timestamppb.Now()
		if err := m.save(rec); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

// save writes a recording's record (recording.json).
func (m *Manager) save(rec *controldv1.Recording) error {
	b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(m.dir(rec.GetId()), MetaFile), b, 0o600)
}

// dirBytes is what a recording's directory holds (its files and frames).
func dirBytes(dir string) uint64 {
	var n uint64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += uint64(fi.Size())
			}
		}
		return nil
	})
	return n
}

// SetSource sets what feeds recordings (the gateway), before any Start.
func (m *Manager) SetSource(s Source) {
	m.mu.Lock()
	m.source = s
	m.mu.Unlock()
}

// free is the space left above the floor on the recordings' filesystem.
func (m *Manager) free() (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(m.opts.Dir, &st); err != nil {
		return 0, err
	}
	avail := st.Bavail * uint64(st.Bsize)
	floor := m.opts.Floor
	if floor == 0 {
		floor = max(1<<30, st.Blocks*uint64(st.Bsize)/20)
	}
	if avail <= floor {
		return 0, nil
	}
	return avail - floor, nil
}

// checkFloor fails when the host's free space fell to the floor.
func (m *Manager) checkFloor() error {
	f, err := m.free()
	if err != nil {
		return err
	}
	if f == 0 {
		return errors.New("the host's free disk space fell to the recordings' floor")
	}
	return nil
}

// Start starts recording a sandbox.
func (m *Manager) Start(_ context.Context, req *controldv1.StartRecordingRequest) (*controldv1.StartRecordingResponse, error) {
	maxBytes, err := rules.StartRecording(req)
	if err != nil {
		return nil, err
	}
	rec, err := m.start(req.GetSandboxId(), maxBytes, "", "")
	if err != nil {
		return nil, err
	}
	return &controldv1.StartRecordingResponse{Recording: rec}, nil
}

func (m *Manager) start(sandboxID string, maxBytes uint64, parentRecording, parentCheckpoint string) (*controldv1.Recording, error) {
	if err := m.opts.Routable(sandboxID); err != nil && !errors.Is(err, errdefs.ErrUnavailable) {
		return nil, err
	}
	free, err := m.free()
	if err != nil {
		return nil, fmt.Errorf("recording: free space: %w", err)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errdefs.WithReason(errdefs.ErrUnavailable, "SHUTTING_DOWN", "controld is stopping")
	}
	if m.source == nil {
		m.mu.Unlock()
		return nil, errdefs.WithReason(errdefs.ErrUnavailable, "STARTING", "the gateway is not serving yet")
	}
	if r := m.active[sandboxID]; r != nil {
		id := r.meta.GetId()
		m.mu.Unlock()
		return nil, rules.SandboxRecording(sandboxID, id)
	}
	// Every running recording may still grow to its cap: that all of them
	// fit above the floor is what keeps the disk from filling.
	var outstanding uint64
	for _, r := range m.active {
		if rest := r.meta.GetMaxBytes(); rest > r.meta.GetBytes() {
			outstanding += rest - r.meta.GetBytes()
		}
	}
	if outstanding+maxBytes > free {
		m.mu.Unlock()
		return nil, rules.RecordingCapReached("the host has %d bytes free above its floor for recordings; the running ones may take %d more and this one asks %d (lower max_bytes)",
			free, outstanding, maxBytes)
	}
	id := rules.NewID(rules.PrefixRecording)
	rec := &controldv1.Recording{
		Id: id, SandboxId: sandboxID, State: controldv1.RecordingState_RECORDING_STATE_RECORDING, StartedAt: timestamppb.Now(),
		MaxBytes: maxBytes, ParentRecordingId: parentRecording, ParentCheckpointId: parentCheckpoint, Dir: m.dir(id),
	}
	r := &recorder{m: m, dir: rec.Dir, meta: rec, wake: make(chan struct{}, 1), done: make(chan struct{}),
		reason: controldv1.RecordingStopReason_RECORDING_STOP_REASON_REQUESTED}
	m.active[sandboxID] = r
	m.byID[id] = r
	m.recs[id] = rec
	source := m.source
	m.mu.Unlock()

	fail := func(err error) (*controldv1.Recording, error) {
		m.mu.Lock()
		delete(m.active, sandboxID)
		delete(m.byID, id)
		delete(m.recs, id)
		m.mu.Unlock()
		os.RemoveAll(rec.Dir)
		return nil, fmt.Errorf("recording: start: %w", err)
	}
	if err := os.Mkdir(rec.Dir, 0o700); err != nil {
		return fail(err)
	}
	if err := r.open(); err != nil {
		return fail(err)
	}
	if err := m.save(rec); err != nil {
		r.stream.Close()
		r.traj.Close()
		return fail(err)
	}
	go r.run()
	r.detach = source.Record(sandboxID, r)
	m.log.Info("recording started", "recording", id, "sandbox", sandboxID, "max_bytes", maxBytes, "parent_checkpoint", parentCheckpoint)
	return m.snapshot(id), nil
}

// finished is the writer's last word: the record is final.
func (m *Manager) finished(r *recorder) {
	m.mu.Lock()
	if m.active[r.meta.GetSandboxId()] == r {
		delete(m.active, r.meta.GetSandboxId())
	}
	delete(m.byID, r.meta.GetId())
	m.mu.Unlock()
	snap := m.snapshot(r.meta.GetId())
	if snap == nil {
		return
	}
	if err := m.save(snap); err != nil {
		m.log.Error("recording: save record", "recording", snap.GetId(), "err", err)
	}
	m.count(snap)
	m.log.Info("recording stopped", "recording", snap.GetId(), "reason", snap.GetStopReason(), "bytes", snap.GetBytes(),
		"frames", snap.GetFrames(), "requests", snap.GetRequests())
}

// snapshot copies a recording's record (nil when unknown).
func (m *Manager) snapshot(id string) *controldv1.Recording {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := m.recs[id]
	if rec == nil {
		return nil
	}
	return cloneRec(rec)
}

func cloneRec(r *controldv1.Recording) *controldv1.Recording {
	return proto.Clone(r).(*controldv1.Recording)
}

// Stop stops a recording (a stopped one is returned as it is).
func (m *Manager) Stop(_ context.Context, req *controldv1.StopRecordingRequest) (*controldv1.StopRecordingResponse, error) {
	if err := rules.RecordingID("id", req.GetId()); err != nil {
		return nil, err
	}
	m.mu.Lock()
	r := m.byID[req.GetId()]
	_, known := m.recs[req.GetId()]
	m.mu.Unlock()
	if !known {
		return nil, rules.RecordingNotFound(req.GetId())
	}
	if r != nil {
		r.stop(controldv1.RecordingStopReason_RECORDING_STOP_REASON_REQUESTED, "")
	}
	return &controldv1.StopRecordingResponse{Recording: m.snapshot(req.GetId())}, nil
}

// Get returns a recording.
func (m *Manager) Get(_ context.Context, req *controldv1.GetRecordingRequest) (*controldv1.GetRecordingResponse, error) {
	if err := rules.RecordingID("id", req.GetId()); err != nil {
		return nil, err
	}
	rec := m.snapshot(req.GetId())
	if rec == nil {
		return nil, rules.RecordingNotFound(req.GetId())
	}
	return &controldv1.GetRecordingResponse{Recording: rec}, nil
}

// List lists recordings, oldest first.
func (m *Manager) List(_ context.Context, req *controldv1.ListRecordingsRequest) (*controldv1.ListRecordingsResponse, error) {
	if err := rules.ListRecordings(req); err != nil {
		return nil, err
	}
	m.mu.Lock()
	var all []*controldv1.Recording
	for _, r := range m.recs {
		if req.GetSandboxId() == "" || r.GetSandboxId() == req.GetSandboxId() {
			all = append(all, cloneRec(r))
		}
	}
	m.mu.Unlock()
	page, next, err := rules.Page(all, rules.RecordingKey, req.GetPageSize(), req.GetPageToken(), req)
	if err != nil {
		return nil, err
	}
	return &controldv1.ListRecordingsResponse{Recordings: page, NextPageToken: next}, nil
}

// Delete removes a stopped recording.
func (m *Manager) Delete(_ context.Context, req *controldv1.DeleteRecordingRequest) (*controldv1.DeleteRecordingResponse, error) {
	if err := rules.RecordingID("id", req.GetId()); err != nil {
		return nil, err
	}
	id := req.GetId()
	m.mu.Lock()
	rec, known := m.recs[id]
	switch {
	case !known:
		m.mu.Unlock()
		return nil, rules.RecordingNotFound(id)
	case rec.GetState() == controldv1.RecordingState_RECORDING_STATE_RECORDING || m.byID[id] != nil:
		m.mu.Unlock()
		return nil, rules.RecordingRunning(id)
	case m.exporting[id]:
		m.mu.Unlock()
		return nil, rules.RecordingExporting(id)
	}
	delete(m.recs, id)
	m.mu.Unlock()
	if err := os.RemoveAll(m.dir(id)); err != nil {
		return nil, fmt.Errorf("recording: delete %s: %w", id, err)
	}
	return &controldv1.DeleteRecordingResponse{}, nil
}

// Active returns the running recording of a sandbox ("" when none).
func (m *Manager) Active(sandboxID string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.active[sandboxID]; r != nil {
		return r.meta.GetId()
	}
	return ""
}

// Forked starts the recordings of a fork's replicas: every replica when
// the fork asked (record), or when the checkpoint's source sandbox is
// recording. Each names its parents. It returns the replicas' recording
// ids (a replica whose recording could not start is logged and left out:
// the fork itself succeeded).
func (m *Manager) Forked(checkpointID, sourceSandboxID string, replicas []string, record bool) map[string]string {
	parent := m.Active(sourceSandboxID)
	if !record && parent == "" {
		return nil
	}
	maxBytes := uint64(rules.DefaultRecordingBytes)
	if p := m.snapshot(parent); p != nil {
		maxBytes = p.GetMaxBytes()
	}
	out := map[string]string{}
	for _, id := range replicas {
		rec, err := m.start(id, maxBytes, parent, checkpointID)
		if err != nil {
			m.log.Warn("recording: a fork's replica is not recorded", "sandbox", id, "checkpoint", checkpointID, "err", err)
			continue
		}
		out[id] = rec.GetId()
	}
	return out
}

// Close stops every running recording (CONTROLD_STOPPED).
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	var rs []*recorder
	for _, r := range m.active {
		rs = append(rs, r)
	}
	m.mu.Unlock()
	for _, r := range rs {
		r.stop(controldv1.RecordingStopReason_RECORDING_STOP_REASON_CONTROLD_STOPPED, "")
	}
}
