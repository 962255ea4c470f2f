package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/recording"
)

func (f *viewFixture) recorder(t *testing.T) *recording.Manager {
	t.Helper()
	m, err := recording.New(recording.Options{Dir: t.TempDir(), Floor: 1, Routable: func(id string) error { _, err := f.vr.Route(id); return err }})
	if err != nil {
		t.Fatal(err)
	}
	m.SetSource(f.gw)
	t.Cleanup(m.Close)
	return m
}

func hashedFrame(seq uint64, key bool, x, y, w, h int, data []byte) *aciv1.Event {
	ev := frame(seq, key, x, y, w, h, data)
	ev.GetFrame().FrameHash = []byte{byte(seq), 0xaa, 0xbb, 0xcc}
	return ev
}

type line struct {
	Seq        uint64          `json:"seq"`
	Source     string          `json:"source"`
	Conn       uint64          `json:"conn"`
	ID         uint64          `json:"id"`
	Method     string          `json:"method"`
	Request    json.RawMessage `json:"request"`
	Outcome    string          `json:"outcome"`
	Error      *struct{ Code string }
	SentNs     int64 `json:"sent_ns"`
	RepliedNs  int64 `json:"replied_ns"`
	FrameAfter *struct {
		Index uint64
		Hash  string
	} `json:"frame_after"`
	ObservationHash string `json:"observation_hash"`
}

func readLines(t *testing.T, path string) []line {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []line
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("trajectory line %q: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

// TestRecording: a recording takes the hub's frames from a keyframe on
// (with frame hashes), reads every ACI request through the gateway and its
// reply into the trajectory, and exports frames whose last one is the
// screen; the sandbox's bytes go through unchanged.
func TestRecording(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	f := setupView(t)
	rm := f.recorder(t)
	ctx := context.Background()
	if _, err := rm.Start(ctx, &controldv1.StartRecordingRequest{SandboxId: "sb-bbbbbbbbbbbbbbbb"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("recording an unknown sandbox: %v", err)
	}
	resp, err := rm.Start(ctx, &controldv1.StartRecordingRequest{SandboxId: viewSB})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetRecording().GetId()
	if _, err := rm.Start(ctx, &controldv1.StartRecordingRequest{SandboxId: viewSB}); errdefs.Reason(err) != "SANDBOX_RECORDING" {
		t.Fatalf("a second recording: %v", err)
	}
	waitFor(t, func() bool { return startedScreencast(f.guest) })
	for _, r := range f.guest.Requests() {
		if s := r.GetScreencastStart(); s != nil && !s.GetFrameHashes() {
			t.Fatal("a recorded screencast without frame hashes")
		}
	}
	// A delta before any keyframe is not recorded; then a keyframe and a delta.
	tile := randomPNG(t, 64, 64, 2)
	f.guest.Push(hashedFrame(1, false, 0, 0, 64, 64, tile))
	key := randomPNG(t, 512, 512, 1)
	f.guest.Push(hashedFrame(2, true, 0, 0, 512, 512, key))
	f.guest.Push(hashedFrame(3, false, 64, 64, 64, 64, tile))
	waitFor(t, func() bool {
		g, _ := rm.Get(ctx, &controldv1.GetRecordingRequest{Id: id})
		return g.GetRecording().GetFrames() == 2
	})

	// An agent through the gateway: a step, a screenshot, a failing request.
	s, err := aci.Dial(ctx, "ws"+f.base[len("http"):]+"/v1/sandboxes/"+viewSB+"/aci", token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Step(ctx, []*aciv1.Action{aci.Type("hello")}, nil); err != nil {
		t.Fatal(err)
	}
	f.guest.SetFrame(randomPNG(t, 32, 32, 3))
	if _, err := s.Screenshot(ctx, aci.PNG()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// A control viewer's input is recorded too.
	v := f.dial(t, "control-1")
	v.next(3)
	if err := v.c.Write(ctx, websocket.MessageText, []byte(`{"t":"text","text":"viewer"}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.HasSuffix(typed(f.guest), "viewer") })

	stopped, err := rm.Stop(ctx, &controldv1.StopRecordingRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	rec := stopped.GetRecording()
	if rec.GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED || rec.GetStopReason() != controldv1.RecordingStopReason_RECORDING_STOP_REASON_REQUESTED ||
		rec.GetFrames() != 2 || rec.GetWidth() != 512 || rec.GetBytes() == 0 {
		t.Fatalf("stopped recording %v", rec)
	}
	lines := readLines(t, filepath.Join(rec.GetDir(), recording.TrajectoryFile))
	var methods []string
	if n := len(lines); n == 0 || lines[n-1].Source != "view" || lines[n-1].Method != "step" || lines[n-1].Outcome != "ok" ||
		!bytes.Contains(lines[n-1].Request, []byte(`"viewer"`)) {
		t.Fatalf("the viewer's line: %+v", lines)
	}
	lines = lines[:len(lines)-1]
	for _, l := range lines {
		methods = append(methods, l.Method)
		if l.Outcome != "ok" || l.SentNs == 0 || l.RepliedNs < l.SentNs || l.FrameAfter == nil || l.FrameAfter.Index != 2 ||
			l.FrameAfter.Hash != hex.EncodeToString([]byte{3, 0xaa, 0xbb, 0xcc}) {
			t.Fatalf("line %+v", l)
		}
	}
	if len(lines) != 3 || methods[0] != "hello" || methods[1] != "step" || methods[2] != "screenshot" {
		t.Fatalf("trajectory methods %v, want hello step screenshot", methods)
	}
	if lines[2].ObservationHash != hex.EncodeToString(f.guest.FrameHash()) {
		t.Fatalf("screenshot line's observation hash %q, want %x", lines[2].ObservationHash, f.guest.FrameHash())
	}
	if !bytes.Contains(lines[1].Request, []byte(`"hello"`)) {
		t.Fatalf("step request %s", lines[1].Request)
	}

	// Frames export: the last PNG is the screen the frames built.
	if _, err := rm.Delete(ctx, &controldv1.DeleteRecordingRequest{Id: id}); err != nil {
		t.Fatal("delete before export:", err) // stopped: deletable
	}
	if _, err := rm.Export(ctx, &controldv1.ExportRecordingRequest{Id: id, Format: controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_FRAMES}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("export of a deleted recording: %v", err)
	}
}

// TestRecordingExportFrames: the frame sequence replays the stream through
// the compositor: its last frame is the keyframe with the delta on it.
func TestRecordingExportFrames(t *testing.T) {
	f := setupView(t)
	rm := f.recorder(t)
	ctx := context.Background()
	resp, err := rm.Start(ctx, &controldv1.StartRecordingRequest{SandboxId: viewSB})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetRecording().GetId()
	waitFor(t, func() bool { return startedScreencast(f.guest) })
	key, tile := randomPNG(t, 512, 512, 1), randomPNG(t, 64, 64, 2)
	f.guest.Push(hashedFrame(1, true, 0, 0, 512, 512, key))
	f.guest.Push(hashedFrame(2, false, 64, 64, 64, 64, tile))
	waitFor(t, func() bool {
		g, _ := rm.Get(ctx, &controldv1.GetRecordingRequest{Id: id})
		return g.GetRecording().GetFrames() == 2
	})
	if _, err := rm.Export(ctx, &controldv1.ExportRecordingRequest{Id: id, Format: controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_FRAMES}); errdefs.Reason(err) != "RECORDING_RUNNING" {
		t.Fatalf("export while running: %v", err)
	}
	if _, err := rm.Stop(ctx, &controldv1.StopRecordingRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	ex, err := rm.Export(ctx, &controldv1.ExportRecordingRequest{Id: id, Format: controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_FRAMES})
	if err != nil {
		t.Fatal(err)
	}
	if ex.GetFrames() != 2 {
		t.Fatalf("export %v", ex)
	}
	want := image.NewRGBA(image.Rect(0, 0, 512, 512))
	kimg, _ := png.Decode(bytes.NewReader(key))
	timg, _ := png.Decode(bytes.NewReader(tile))
	drawInto(want, kimg, 0, 0)
	drawInto(want, timg, 64, 64)
	b, err := os.ReadFile(filepath.Join(ex.GetPath(), "frame-000002.png"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	for y := 0; y < 512; y++ {
		for x := 0; x < 512; x++ {
			r1, g1, b1, _ := got.At(x, y).RGBA()
			r2, g2, b2, _ := want.At(x, y).RGBA()
			if r1 != r2 || g1 != g2 || b1 != b2 {
				t.Fatalf("pixel %d,%d differs", x, y)
			}
		}
	}
	if g, _ := rm.Get(ctx, &controldv1.GetRecordingRequest{Id: id}); g.GetRecording().GetBytes() <= resp.GetRecording().GetBytes()+uint64(len(b)) {
		t.Fatalf("bytes %d do not count the export", g.GetRecording().GetBytes())
	}
}

func drawInto(dst *image.RGBA, src image.Image, x, y int) {
	b := src.Bounds()
	for j := 0; j < b.Dy(); j++ {
		for i := 0; i < b.Dx(); i++ {
			dst.Set(x+i, y+j, src.At(b.Min.X+i, b.Min.Y+j))
		}
	}
}

// TestRecordingCap: a recording stops at its max_bytes with a typed reason
// and writes nothing past it; the sandbox's screencast goes on.
func TestRecordingCap(t *testing.T) {
	f := setupView(t)
	rm := f.recorder(t)
	ctx := context.Background()
	resp, err := rm.Start(ctx, &controldv1.StartRecordingRequest{SandboxId: viewSB, MaxBytes: rules.MinRecordingBytes})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetRecording().GetId()
	waitFor(t, func() bool { return startedScreencast(f.guest) })
	for i := range 8 {
		f.guest.Push(hashedFrame(uint64(i+1), true, 0, 0, 512, 512, randomPNG(t, 512, 512, uint64(i))))
	}
	var rec *controldv1.Recording
	waitFor(t, func() bool {
		g, _ := rm.Get(ctx, &controldv1.GetRecordingRequest{Id: id})
		rec = g.GetRecording()
		return rec.GetState() == controldv1.RecordingState_RECORDING_STATE_STOPPED
	})
	if rec.GetStopReason() != controldv1.RecordingStopReason_RECORDING_STOP_REASON_CAP_REACHED || rec.GetBytes() > rules.MinRecordingBytes {
		t.Fatalf("capped recording %v", rec)
	}
	fi, err := os.Stat(filepath.Join(rec.GetDir(), recording.StreamFile))
	if err != nil || uint64(fi.Size()) > rules.MinRecordingBytes {
		t.Fatalf("stream file %v %v", fi, err)
	}
	// The sandbox can be recorded again.
	if _, err := rm.Start(ctx, &controldv1.StartRecordingRequest{SandboxId: viewSB}); err != nil {
		t.Fatal(err)
	}
}
