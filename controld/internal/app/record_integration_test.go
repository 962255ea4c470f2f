package app_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"image/png"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/client"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/recording"
)

// TestRealStackRecording records a sandbox on the real stack while an agent
// types into its xterm through controld's gateway:
//
//   - the trajectory has one line per request the agent sent, in order,
//     each ok, with its reply's frame hash for the screenshot;
//   - the recorded frames decode (api/screencast's compositor) and the last
//     one equals the PNG screenshot taken at the end, pixel for pixel;
//   - the MP4 export decodes (ffprobe) with the recording's duration and
//     fps x duration frames;
//   - the Go client downloads the MP4 through the gateway (a recording
//     ticket), equal to the file on the host; a ticket works once;
//   - a replica forked from a checkpoint of the recorded sandbox records
//     too, starting with a keyframe and naming its parents.
func TestRealStackRecording(t *testing.T) {
	ffprobe, err := exec.LookPath("ffprobe")
	if err != nil {
		t.Fatal("ffprobe (Debian's ffmpeg, deploy/host-setup.sh installs it):", err)
	}
	s := newStackIn(t, "forkfleet-record-it")
	ctx := s.ctx
	s.launch(1)
	s.waitSlots(1)
	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	must(t, err)
	id := cr.Sandbox.Id
	t.Cleanup(func() { s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: id}) })
	start, err := s.sbc.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: id, MaxBytes: recordingCap})
	must(t, err)
	rec := start.GetRecording()
	// While recording, the endpoint sends agents through the gateway.
	ep, err := s.sbc.GetSandboxEndpoint(ctx, &controldv1.GetSandboxEndpointRequest{Id: id})
	must(t, err)
	if ep.GetEndpoint().GetUnixPath() != "" {
		t.Fatalf("a recorded sandbox's endpoint names guestd's socket: %v", ep.GetEndpoint())
	}
	sess, err := aci.Dial(ctx, ep.GetEndpoint().GetUrl(), ep.GetEndpoint().GetToken())
	must(t, err)
	want := []string{"hello"}
	// Type into the xterm, key by key as an agent would, and scroll.
	for _, line := range []string{"echo recorded-one > /tmp/rec1", "seq 1 200", "echo recorded-two > /tmp/rec2"} {
		_, err := sess.Step(ctx, []*aciv1.Action{aci.Type(line), aci.Key("Return")}, nil)
		must(t, err)
		want = append(want, "step")
	}
	_, err = sess.Step(ctx, []*aciv1.Action{aci.Scroll(400, 300, 0, -3)}, nil)
	must(t, err)
	want = append(want, "step")
	waitFile(t, ctx, sess, "/tmp/rec2", "recorded-two")
	// waitFile polls with exec: count its requests from the trajectory.
	time.Sleep(time.Second) // the screen settles (the xterm's cursor does not blink)
	shot, err := sess.Screenshot(ctx, aci.PNG())
	must(t, err)
	time.Sleep(500 * time.Millisecond) // the recorder has the last frame
	sess.Close()
	stopped, err := s.sbc.StopRecording(ctx, &controldv1.StopRecordingRequest{Id: rec.GetId()})
	must(t, err)
	rec = stopped.GetRecording()
	if rec.GetStopReason() != controldv1.RecordingStopReason_RECORDING_STOP_REASON_REQUESTED || rec.GetFrames() < 2 || rec.GetWidth() == 0 {
		t.Fatalf("stopped recording: %v", rec)
	}

	// The trajectory: the agent's requests in order, execs of waitFile
	// between the steps and the screenshot.
	var lines []trajectoryLine
	b, err := os.ReadFile(filepath.Join(rec.GetDir(), recording.TrajectoryFile))
	must(t, err)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l trajectoryLine
		must(t, json.Unmarshal(sc.Bytes(), &l))
		lines = append(lines, l)
	}
	var got []string
	for i, l := range lines {
		if l.Outcome != "ok" || l.RepliedNs < l.SentNs || (i > 0 && l.ID <= lines[i-1].ID) {
			t.Fatalf("line %d: %+v", i, l)
		}
		if l.Method != "exec" {
			got = append(got, l.Method)
		}
	}
	want = append(want, "screenshot")
	if len(got) != len(want) {
		t.Fatalf("trajectory %v, want %v (and execs)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("trajectory %v, want %v (and execs)", got, want)
		}
	}
	last := lines[len(lines)-1]
	if last.ObservationHash != hex.EncodeToString(shot.FrameHash) || last.FrameAfter == nil || last.FrameAfter.Index == 0 {
		t.Fatalf("screenshot line %+v, screenshot hash %x", last, shot.FrameHash)
	}
	if rec.GetRequests() != uint64(len(lines)) {
		t.Fatalf("record counts %d requests, the file has %d lines", rec.GetRequests(), len(lines))
	}

	// The frames decode; the last equals the screenshot.
	fr, err := s.sbc.ExportRecording(ctx, &controldv1.ExportRecordingRequest{Id: rec.GetId(), Format: controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_FRAMES})
	must(t, err)
	if fr.GetFrames() != rec.GetFrames() {
		t.Fatalf("frames export %d of %d frames", fr.GetFrames(), rec.GetFrames())
	}
	lastPNG, err := os.ReadFile(filepath.Join(fr.GetPath(), "frame-"+pad6(fr.GetFrames())+".png"))
	must(t, err)
	gotImg, err := png.Decode(bytes.NewReader(lastPNG))
	must(t, err)
	wantImg, err := png.Decode(bytes.NewReader(shot.Data))
	must(t, err)
	if gotImg.Bounds() != wantImg.Bounds() {
		t.Fatalf("last frame %v, screenshot %v", gotImg.Bounds(), wantImg.Bounds())
	}
	for y := 0; y < wantImg.Bounds().Dy(); y++ {
		for x := 0; x < wantImg.Bounds().Dx(); x++ {
			r1, g1, b1, _ := gotImg.At(x, y).RGBA()
			r2, g2, b2, _ := wantImg.At(x, y).RGBA()
			if r1 != r2 || g1 != g2 || b1 != b2 {
				t.Fatalf("last recorded frame != screenshot at %d,%d", x, y)
			}
		}
	}

	// MP4: ffprobe reads it back with the recording's duration and frames.
	mp4, err := s.sbc.ExportRecording(ctx, &controldv1.ExportRecordingRequest{Id: rec.GetId(), Format: controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_MP4, Fps: 30})
	must(t, err)
	frames, dur := ffprobeMP4(t, ffprobe, mp4.GetPath())
	if frames != int(mp4.GetFrames()) || math.Abs(dur-mp4.GetDuration().AsDuration().Seconds()) > 0.1 {
		t.Fatalf("ffprobe: %d frames %.3fs; export says %d frames %v", frames, dur, mp4.GetFrames(), mp4.GetDuration().AsDuration())
	}
	span := rec.GetStoppedAt().AsTime().Sub(rec.GetStartedAt().AsTime()).Seconds()
	if dur > span+0.1 || dur < span-2 {
		t.Fatalf("MP4 of %.3fs for a recording of %.3fs", dur, span)
	}

	// Download: the Go client fetches the MP4 through the gateway with a
	// single-use recording ticket; it is the file on the host, byte for
	// byte, and the ticket does not work twice.
	c, err := client.Dial(ctx, "unix://"+s.addrs.GRPCUnix, client.WithToken(""))
	must(t, err)
	defer c.Close()
	local := filepath.Join(t.TempDir(), "download.mp4")
	n, err := c.Recording(rec.GetId()).Download(ctx, controldv1.RecordingFile_RECORDING_FILE_MP4, local)
	must(t, err)
	onHost, err := os.ReadFile(mp4.GetPath())
	must(t, err)
	downloaded, err := os.ReadFile(local)
	must(t, err)
	if n != int64(len(onHost)) || !bytes.Equal(downloaded, onHost) {
		t.Fatalf("downloaded %d bytes, differing from the %d on the host", n, len(onHost))
	}
	tk, err := s.sbc.CreateRecordingTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: rec.GetId(), File: controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY})
	must(t, err)
	if !strings.HasPrefix(tk.GetUrl(), "http://"+s.addrs.Gateway+"/v1/recordings/"+rec.GetId()+"/files/trajectory.jsonl?ticket=") {
		t.Fatalf("ticket URL %s (gateway %s)", tk.GetUrl(), s.addrs.Gateway)
	}
	traj, err := os.ReadFile(filepath.Join(rec.GetDir(), recording.TrajectoryFile))
	must(t, err)
	for i, want := range []int{http.StatusOK, http.StatusUnauthorized} {
		resp, err := http.Get(tk.GetUrl())
		must(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must(t, err)
		if resp.StatusCode != want || (i == 0 && !bytes.Equal(body, traj)) {
			t.Fatalf("trajectory download %d: %s, %d bytes (the host's %d)", i, resp.Status, len(body), len(traj))
		}
	}

	// Forks: a replica of a recording source records from a keyframe and
	// names its parents.
	again, err := s.sbc.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: id, MaxBytes: recordingCap})
	must(t, err)
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: id})
	must(t, err)
	fk, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 1})
	must(t, err)
	rep := fk.GetReplicas()[0]
	if rep.GetErrorMessage() != "" || rep.GetRecordingId() == "" || rep.GetEndpoint().GetUnixPath() != "" {
		t.Fatalf("replica %v", rep)
	}
	t.Cleanup(func() {
		s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: rep.GetSandbox().GetId()})
	})
	var rr *controldv1.Recording
	deadline := time.Now().Add(30 * time.Second)
	for {
		g, err := s.sbc.GetRecording(ctx, &controldv1.GetRecordingRequest{Id: rep.GetRecordingId()})
		must(t, err)
		rr = g.GetRecording()
		if rr.GetFrames() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica's recording has no frame: %v", rr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rr.GetParentRecordingId() != again.GetRecording().GetId() || rr.GetParentCheckpointId() != ck.Checkpoint.Id || rr.GetSandboxId() != rep.GetSandbox().GetId() {
		t.Fatalf("replica recording %v", rr)
	}
	_, err = s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: rep.GetSandbox().GetId()})
	must(t, err)
	deadline = time.Now().Add(30 * time.Second)
	for rr.GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED {
		if time.Now().After(deadline) {
			t.Fatalf("the recording of a deleted replica goes on: %v", rr)
		}
		time.Sleep(100 * time.Millisecond)
		g, err := s.sbc.GetRecording(ctx, &controldv1.GetRecordingRequest{Id: rep.GetRecordingId()})
		must(t, err)
		rr = g.GetRecording()
	}
	if rr.GetStopReason() != controldv1.RecordingStopReason_RECORDING_STOP_REASON_SANDBOX_GONE {
		t.Fatalf("replica recording stopped: %v", rr)
	}
	f, err := os.Open(filepath.Join(rr.GetDir(), recording.StreamFile))
	must(t, err)
	defer f.Close()
	sr, err := recording.NewStreamReader(f)
	must(t, err)
	first, err := sr.Next()
	must(t, err)
	if !first.Frame.GetKeyframe() {
		t.Fatalf("the replica's recording starts with %v, not a keyframe", first.Frame)
	}
	_, err = s.sbc.StopRecording(ctx, &controldv1.StopRecordingRequest{Id: again.GetRecording().GetId()})
	must(t, err)
}

// trajectoryLine is what the test reads of a trajectory line
// (controld/docs/recording.md has them all).
type trajectoryLine struct {
	ID              uint64 `json:"id"`
	Method          string `json:"method"`
	Outcome         string `json:"outcome"`
	SentNs          int64  `json:"sent_ns"`
	RepliedNs       int64  `json:"replied_ns"`
	ObservationHash string `json:"observation_hash"`
	FrameAfter      *struct {
		Index uint64 `json:"index"`
		Hash  string `json:"hash"`
	} `json:"frame_after"`
}

// recordingCap is the tests' max_bytes: far more than they write, far less
// than the 1 GiB default, which a shared host's free space above the
// recordings' floor may not hold.
const recordingCap = 64 << 20

func pad6(n uint64) string {
	s := strconv.FormatUint(n, 10)
	for len(s) < 6 {
		s = "0" + s
	}
	return s
}

// ffprobeMP4 returns the frames ffprobe decodes from an MP4 and its duration.
func ffprobeMP4(t *testing.T, ffprobe, path string) (int, float64) {
	t.Helper()
	out, err := exec.Command(ffprobe, "-v", "error", "-select_streams", "v:0", "-count_frames",
		"-show_entries", "stream=nb_read_frames,duration", "-of", "json", path).Output()
	if err != nil {
		t.Fatalf("ffprobe %s: %v", path, err)
	}
	var r struct {
		Streams []struct {
			Frames   string `json:"nb_read_frames"`
			Duration string `json:"duration"`
		} `json:"streams"`
	}
	must(t, json.Unmarshal(out, &r))
	if len(r.Streams) != 1 {
		t.Fatalf("ffprobe: %s", out)
	}
	n, err := strconv.Atoi(r.Streams[0].Frames)
	must(t, err)
	d, err := strconv.ParseFloat(r.Streams[0].Duration, 64)
	must(t, err)
	return n, d
}
