package gateway_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/gateway"
	"github.com/forkfleet/forkfleet/controld/internal/recording"
)

// download GETs a URL and returns its status, headers and body.
func download(t *testing.T, url string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// TestRecordingDownload: a recording ticket downloads the one file it names
// of a stopped recording, once, through the gateway, with its exact length
// and type; every refusal (spent, expired, another file, an unknown
// recording, a deleted one, a path, a link) is the same 401.
func TestRecordingDownload(t *testing.T) {
	f := setupView(t)
	var h http.Handler
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	t.Cleanup(ts.Close)
	rm, err := recording.New(recording.Options{Dir: t.TempDir(), Floor: 1, GatewayHost: strings.TrimPrefix(ts.URL, "http://"),
		Routable: func(id string) error { _, err := f.vr.Route(id); return err }})
	if err != nil {
		t.Fatal(err)
	}
	rm.SetSource(f.gw)
	t.Cleanup(rm.Close)
	h = gateway.New(f.vr, gateway.Options{Downloads: rm})
	ctx := context.Background()

	resp, err := rm.Start(ctx, &controldv1.StartRecordingRequest{SandboxId: viewSB})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetRecording().GetId()
	ticket := func(file controldv1.RecordingFile) *controldv1.CreateRecordingTicketResponse {
		t.Helper()
		r, err := rm.CreateTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: id, File: file})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waitFor(t, func() bool { return startedScreencast(f.guest) })
	f.guest.Push(hashedFrame(1, true, 0, 0, 256, 256, randomPNG(t, 256, 256, 1)))
	f.guest.Push(hashedFrame(2, false, 64, 64, 64, 64, randomPNG(t, 64, 64, 2)))
	waitFor(t, func() bool {
		g, _ := rm.Get(ctx, &controldv1.GetRecordingRequest{Id: id})
		return g.GetRecording().GetFrames() == 2
	})
	if _, err := rm.CreateTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: id, File: controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY}); errdefs.Reason(err) != "RECORDING_RUNNING" {
		t.Fatalf("a ticket of a running recording: %v", err)
	}
	if _, err := rm.Stop(ctx, &controldv1.StopRecordingRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []*controldv1.CreateRecordingTicketRequest{
		{Id: id},
		{Id: id, File: 99},
		{Id: "../etc", File: controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY},
		{Id: id, File: controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY, Ttl: durationpb.New(time.Hour)},
	} {
		if _, err := rm.CreateTicket(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("ticket %v: %v", bad, err)
		}
	}
	if _, err := rm.CreateTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: "rc-bbbbbbbbbbbbbbbb", File: controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a ticket of an unknown recording: %v", err)
	}
	if _, err := rm.CreateTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: id, File: controldv1.RecordingFile_RECORDING_FILE_MP4}); errdefs.Reason(err) != "RECORDING_NOT_EXPORTED" {
		t.Fatalf("a ticket of an MP4 not exported: %v", err)
	}
	dir := filepath.Join(resp.GetRecording().GetDir())

	// The trajectory, once, exactly.
	tr := ticket(controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY)
	if tr.GetName() != "trajectory.jsonl" || !strings.HasPrefix(tr.GetUrl(), ts.URL+"/v1/recordings/"+id+"/files/trajectory.jsonl?ticket=") {
		t.Fatalf("ticket %v", tr)
	}
	code, hdr, body := download(t, tr.GetUrl())
	want, _ := os.ReadFile(filepath.Join(dir, recording.TrajectoryFile))
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/x-ndjson" || hdr.Get("Content-Length") != itoa(len(want)) || !bytes.Equal(body, want) {
		t.Fatalf("trajectory: %d %v %d bytes, want %d", code, hdr, len(body), len(want))
	}
	code, _, denied := download(t, tr.GetUrl())
	if code != http.StatusUnauthorized {
		t.Fatalf("a spent ticket: %d", code)
	}
	refused := func(what, url string) {
		t.Helper()
		code, _, b := download(t, url)
		if code != http.StatusUnauthorized || !bytes.Equal(b, denied) {
			t.Fatalf("%s: %d %q, want the same 401", what, code, b)
		}
	}
	refused("an unknown recording", ts.URL+"/v1/recordings/rc-bbbbbbbbbbbbbbbb/files/trajectory.jsonl?ticket=x")
	refused("no ticket", ts.URL+"/v1/recordings/"+id+"/files/trajectory.jsonl")

	// The screencast: a ticket is for its own file and recording, and a
	// refused request does not spend it.
	sc := ticket(controldv1.RecordingFile_RECORDING_FILE_SCREENCAST)
	q := sc.GetUrl()[strings.Index(sc.GetUrl(), "?"):]
	base := ts.URL + "/v1/recordings/" + id + "/files/"
	refused("another file", base+"trajectory.jsonl"+q)
	refused("another recording", ts.URL+"/v1/recordings/rc-bbbbbbbbbbbbbbbb/files/screencast.ffrec"+q)
	refused("a path", base+"..%2f"+id+"%2fscreencast.ffrec"+q)
	refused("a path", base+"%2e%2e%2frecording.json"+q)
	refused("the record", base+"recording.json"+q)
	code, hdr, body = download(t, sc.GetUrl())
	want, _ = os.ReadFile(filepath.Join(dir, recording.StreamFile))
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/octet-stream" || !bytes.Equal(body, want) || len(want) < 100 {
		t.Fatalf("screencast: %d %v %d bytes, want %d", code, hdr, len(body), len(want))
	}

	// Expired.
	ex, err := rm.CreateTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: id, File: controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY, Ttl: durationpb.New(time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	refused("an expired ticket", ex.GetUrl())

	// A link where the file was is not followed.
	lt := ticket(controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY)
	traj := filepath.Join(dir, recording.TrajectoryFile)
	os.Rename(traj, traj+".moved")
	if err := os.Symlink(filepath.Join(dir, recording.MetaFile), traj); err != nil {
		t.Fatal(err)
	}
	refused("a symbolic link", lt.GetUrl())
	os.Remove(traj)
	os.Rename(traj+".moved", traj)

	// The frames export as a tar of frames/, its length known up front.
	if _, err := rm.Export(ctx, &controldv1.ExportRecordingRequest{Id: id, Format: controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_FRAMES}); err != nil {
		t.Fatal(err)
	}
	code, hdr, body = download(t, ticket(controldv1.RecordingFile_RECORDING_FILE_FRAMES).GetUrl())
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/x-tar" || hdr.Get("Content-Length") != itoa(len(body)) {
		t.Fatalf("frames: %d %v %d bytes", code, hdr, len(body))
	}
	tarred := map[string][]byte{}
	rd := tar.NewReader(bytes.NewReader(body))
	for {
		th, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		tarred[th.Name], _ = io.ReadAll(rd)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, recording.FramesDir))
	if len(ents) != 3 || len(tarred) != len(ents) {
		t.Fatalf("frames dir %v, tar %d members", ents, len(tarred))
	}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, recording.FramesDir, e.Name()))
		if !bytes.Equal(tarred["frames/"+e.Name()], b) {
			t.Fatalf("tar member %s differs", e.Name())
		}
	}

	// A deleted recording's ticket is refused like any other.
	dt := ticket(controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY)
	if _, err := rm.Delete(ctx, &controldv1.DeleteRecordingRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	refused("a deleted recording", dt.GetUrl())
}

func itoa(n int) string { return strconv.Itoa(n) }
