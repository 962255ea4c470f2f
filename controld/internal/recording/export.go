package recording

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/api/screencast"
)

// Export renders a stopped recording next to it: recording.mp4, or frames/
// (one PNG per recorded frame and frames.jsonl). What it writes counts
// against the recording's max_bytes; an export that would pass it is
// removed and fails RESOURCE_EXHAUSTED.
func (m *Manager) Export(ctx context.Context, req *controldv1.ExportRecordingRequest) (*controldv1.ExportRecordingResponse, error) {
	fps, err := rules.ExportRecording(req)
	if err != nil {
		return nil, err
	}
	id := req.GetId()
	m.mu.Lock()
	rec, known := m.recs[id]
	switch {
	case !known:
		m.mu.Unlock()
		return nil, rules.RecordingNotFound(id)
	case rec.GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED:
		m.mu.Unlock()
		return nil, rules.RecordingRunning(id)
	case m.exporting[id]:
		m.mu.Unlock()
		return nil, rules.RecordingExporting(id)
	case rec.GetFrames() == 0:
		m.mu.Unlock()
		return nil, rules.RecordingEmpty(id)
	}
	m.exporting[id] = true
	rec = cloneRec(rec)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.exporting, id)
		if r := m.recs[id]; r != nil {
			r.Bytes = dirBytes(m.dir(id))
			m.save(r)
		}
		m.mu.Unlock()
	}()

	dir := m.dir(id)
	var old string
	if req.GetFormat() == controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_MP4 {
		old = filepath.Join(dir, MP4File)
	} else {
		old = filepath.Join(dir, FramesDir)
	}
	os.RemoveAll(old) // a new export replaces the previous one
	budget := int64(rec.GetMaxBytes()) - int64(dirBytes(dir))
	free, err := m.free()
	if err != nil {
		return nil, fmt.Errorf("recording: free space: %w", err)
	}
	budget = min(budget, int64(free))
	if budget <= 0 {
		return nil, rules.RecordingCapReached("recording %s has no room left for an export (max_bytes %d)", id, rec.GetMaxBytes())
	}
	if req.GetFormat() == controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_MP4 {
		return m.exportMP4(ctx, rec, fps, budget)
	}
	return m.exportFrames(ctx, rec, budget)
}

// replay reads a recording's screencast through a compositor and calls fn
// after each frame it applied (the framebuffer then shows that frame).
func replay(ctx context.Context, dir string, fn func(c *screencast.Compositor, f *StreamRecord) error) error {
	var n uint64
	return replayIndexed(ctx, dir, &n, fn)
}

// span is a recording's first frame time and its end (stopped_at, or its
// last frame).
func span(ctx context.Context, dir string, rec *controldv1.Recording) (start, end time.Time, w, h int, err error) {
	err = replay(ctx, dir, func(c *screencast.Compositor, f *StreamRecord) error {
		if start.IsZero() {
			start = f.At
			w, h = c.Size()
		}
		end = f.At
		return nil
	})
	if s := rec.GetStoppedAt().AsTime(); rec.GetStoppedAt() != nil && s.After(end) {
		end = s
	}
	return start, end, w, h, err
}

func (m *Manager) exportMP4(ctx context.Context, rec *controldv1.Recording, fps uint32, budget int64) (*controldv1.ExportRecordingResponse, error) {
	dir := m.dir(rec.GetId())
	start, end, w, h, err := span(ctx, dir, rec)
	if err != nil {
		return nil, fmt.Errorf("recording: export: %w", err)
	}
	if w == 0 {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "RECORDING_EMPTY", "recording %s holds no keyframe", rec.GetId())
	}
	step := time.Second / time.Duration(fps)
	n := int((end.Sub(start) + step - 1) / step)
	n = max(n, 1)
	out := filepath.Join(dir, MP4File)
	tmp := out + ".tmp.mp4"
	defer os.Remove(tmp)
	// Even dimensions for yuv420p; -fs stops ffmpeg at the budget.
	cmd := exec.CommandContext(ctx, m.opts.FFmpeg, "-hide_banner", "-loglevel", "error", "-nostdin",
		"-f", "rawvideo", "-pix_fmt", "rgba", "-s", fmt.Sprintf("%dx%d", w, h), "-framerate", strconv.Itoa(int(fps)), "-i", "pipe:0",
		"-an", "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p",
		"-movflags", "+faststart", "-fs", strconv.FormatInt(budget, 10), "-f", "mp4", "-y", tmp)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{b: &stderr, n: 4 << 10}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "FFMPEG_MISSING",
				"MP4 export needs ffmpeg on controld's host (deploy/host-setup.sh installs Debian's): %v", err)
		}
		return nil, fmt.Errorf("recording: ffmpeg: %w", err)
	}
	bw := bufio.NewWriterSize(stdin, 1<<20)
	written := 0
	var pix []byte
	var last []byte // the frame shown now (RGBA)
	emitUntil := func(t time.Time) error {
		for written < n && !start.Add(time.Duration(written)*step).After(t) {
			if _, err := bw.Write(last); err != nil {
				return err
			}
			written++
		}
		return nil
	}
	werr := replay(ctx, dir, func(c *screencast.Compositor, f *StreamRecord) error {
		// The frame shown from f.At on: first emit the ticks before it.
		if last != nil {
			if err := emitUntil(f.At.Add(-time.Nanosecond)); err != nil {
				return err
			}
		}
		var fw, fh int
		pix, fw, fh = c.Snapshot(pix)
		if fw == w && fh == h { // a keyframe of another size is not shown
			last = append(last[:0], pix...)
		}
		return nil
	})
	if werr == nil && last != nil {
		werr = emitUntil(start.Add(time.Duration(n) * step))
	}
	if werr == nil {
		werr = bw.Flush()
	}
	stdin.Close()
	err = cmd.Wait()
	if werr != nil && err == nil {
		err = werr
	}
	fi, statErr := os.Stat(tmp)
	if statErr == nil && fi.Size() >= budget {
		return nil, rules.RecordingCapReached("the MP4 of recording %s passes its max_bytes (%d bytes left)", rec.GetId(), budget)
	}
	if err != nil {
		return nil, fmt.Errorf("recording: ffmpeg: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	if statErr != nil {
		return nil, fmt.Errorf("recording: ffmpeg wrote nothing: %w", statErr)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return nil, err
	}
	return &controldv1.ExportRecordingResponse{Path: out, Bytes: uint64(fi.Size()), Frames: uint64(written),
		Duration: durationpb.New(time.Duration(written) * step)}, nil
}

// frameLine is one line of frames/frames.jsonl.
type frameLine struct {
	File       string `json:"file"`
	Index      uint64 `json:"index"` // the frame's index in screencast.ffrec, from 1 (trajectory frame refs)
	Keyframe   bool   `json:"keyframe,omitempty"`
	AtNs       int64  `json:"at_ns"`
	CapturedNs int64  `json:"captured_ns,omitempty"`
	Hash       string `json:"hash,omitempty"`
}

func (m *Manager) exportFrames(ctx context.Context, rec *controldv1.Recording, budget int64) (*controldv1.ExportRecordingResponse, error) {
	dir := m.dir(rec.GetId())
	fdir := filepath.Join(dir, FramesDir)
	if err := os.Mkdir(fdir, 0o700); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(fdir)
		}
	}()
	index, err := os.OpenFile(filepath.Join(fdir, "frames.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer index.Close()
	var total int64
	var count, frameIdx uint64
	var first, lastAt time.Time
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	var buf bytes.Buffer
	errFull := errors.New("full")
	// frameIdx counts every frame record, as the recorder numbered them.
	err = replayIndexed(ctx, dir, &frameIdx, func(c *screencast.Compositor, f *StreamRecord) error {
		img := c.Image()
		buf.Reset()
		if err := enc.Encode(&buf, img); err != nil {
			return err
		}
		count++
		name := fmt.Sprintf("frame-%06d.png", count)
		l := frameLine{File: name, Index: frameIdx, Keyframe: f.Frame.GetKeyframe(), AtNs: f.At.UnixNano(), Hash: hexOrEmpty(f.Frame.GetFrameHash())}
		if t := c.CapturedAt(); !t.IsZero() {
			l.CapturedNs = t.UnixNano()
		}
		lb, _ := json.Marshal(l)
		lb = append(lb, '\n')
		total += int64(buf.Len() + len(lb))
		if total >= budget {
			return errFull
		}
		if err := os.WriteFile(filepath.Join(fdir, name), buf.Bytes(), 0o600); err != nil {
			return err
		}
		if _, err := index.Write(lb); err != nil {
			return err
		}
		if first.IsZero() {
			first = f.At
		}
		lastAt = f.At
		return nil
	})
	if errors.Is(err, errFull) {
		return nil, rules.RecordingCapReached("the frames of recording %s pass its max_bytes (%d bytes left)", rec.GetId(), budget)
	}
	if err != nil {
		return nil, fmt.Errorf("recording: export frames: %w", err)
	}
	if err := index.Close(); err != nil {
		return nil, err
	}
	ok = true
	return &controldv1.ExportRecordingResponse{Path: fdir, Bytes: uint64(total), Frames: count,
		Duration: durationpb.New(lastAt.Sub(first))}, nil
}

// replayIndexed is replay that also counts every frame record in *idx
// (applied or not), the numbering of the trajectory's frame refs.
func replayIndexed(ctx context.Context, dir string, idx *uint64, fn func(c *screencast.Compositor, f *StreamRecord) error) error {
	file, err := os.Open(filepath.Join(dir, StreamFile))
	if err != nil {
		return err
	}
	defer file.Close()
	sr, err := NewStreamReader(file)
	if err != nil {
		return err
	}
	comp := screencast.NewCompositor(screencast.RGBA)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := sr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if r.Frame == nil {
			continue
		}
		*idx++
		if comp.Apply(r.Frame) != nil {
			continue
		}
		if err := fn(comp, &r); err != nil {
			return err
		}
	}
}

// limitedBuffer keeps the first n bytes written (ffmpeg's stderr).
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
