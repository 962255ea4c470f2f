package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Recording is a recording of a sandbox, written by controld on its host
// (the delta screencast and a JSONL trajectory of the ACI requests through
// controld's gateway; controld/docs/recording.md).
type Recording struct {
	c  *Client
	id string
}

// Recording returns a handle on a recording by id (no RPC).
func (c *Client) Recording(id string) *Recording { return &Recording{c: c, id: id} }

// ID is the recording's id ("rc-...").
func (r *Recording) ID() string { return r.id }

// StartRecording starts recording the sandbox within maxBytes of disk
// (0: controld's default, 1 GiB). While it records, the sandbox's endpoint
// sends ACI sessions through controld's gateway, where the trajectory is
// read: sessions opened after this call are recorded (the client drops its
// cached endpoint so its next ACI session takes the gateway).
func (sb *Sandbox) StartRecording(ctx context.Context, maxBytes uint64) (*Recording, *controldv1.Recording, error) {
	resp, err := sb.c.sandboxes.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: sb.id, MaxBytes: maxBytes})
	if err != nil {
		return nil, nil, convert(ctx, err)
	}
	sb.mu.Lock()
	sb.endpoint = nil
	sb.mu.Unlock()
	return &Recording{c: sb.c, id: resp.GetRecording().GetId()}, resp.GetRecording(), nil
}

// Recordings lists the sandbox's recordings, oldest first.
func (sb *Sandbox) Recordings(ctx context.Context) ([]*controldv1.Recording, error) {
	return sb.c.ListRecordings(ctx, sb.id)
}

// ListRecordings lists the recordings of one sandbox (every recording when
// sandboxID is empty), oldest first, every page.
func (c *Client) ListRecordings(ctx context.Context, sandboxID string) ([]*controldv1.Recording, error) {
	var out []*controldv1.Recording
	tok := ""
	for {
		resp, err := c.sandboxes.ListRecordings(ctx, &controldv1.ListRecordingsRequest{SandboxId: sandboxID, PageToken: tok})
		if err != nil {
			return nil, convert(ctx, err)
		}
		out = append(out, resp.GetRecordings()...)
		if tok = resp.GetNextPageToken(); tok == "" {
			return out, nil
		}
	}
}

// Stop stops the recording and returns its final record (a stopped one as
// it is: stop_reason says why it ended, CAP_REACHED at its max_bytes).
func (r *Recording) Stop(ctx context.Context) (*controldv1.Recording, error) {
	resp, err := r.c.sandboxes.StopRecording(ctx, &controldv1.StopRecordingRequest{Id: r.id})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return resp.GetRecording(), nil
}

// Get returns the recording's record.
func (r *Recording) Get(ctx context.Context) (*controldv1.Recording, error) {
	resp, err := r.c.sandboxes.GetRecording(ctx, &controldv1.GetRecordingRequest{Id: r.id})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return resp.GetRecording(), nil
}

// ExportMP4 renders the stopped recording to an MP4 at fps (0: 30) on
// controld's host and returns where.
func (r *Recording) ExportMP4(ctx context.Context, fps uint32) (*controldv1.ExportRecordingResponse, error) {
	return r.export(ctx, controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_MP4, fps)
}

// ExportFrames writes one PNG per recorded frame and frames.jsonl on
// controld's host and returns the directory.
func (r *Recording) ExportFrames(ctx context.Context) (*controldv1.ExportRecordingResponse, error) {
	return r.export(ctx, controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_FRAMES, 0)
}

func (r *Recording) export(ctx context.Context, f controldv1.RecordingExportFormat, fps uint32) (*controldv1.ExportRecordingResponse, error) {
	resp, err := r.c.sandboxes.ExportRecording(ctx, &controldv1.ExportRecordingRequest{Id: r.id, Format: f, Fps: fps})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return resp, nil
}

// Delete removes the stopped recording and its exports.
func (r *Recording) Delete(ctx context.Context) error {
	_, err := r.c.sandboxes.DeleteRecording(ctx, &controldv1.DeleteRecordingRequest{Id: r.id})
	return convert(ctx, err)
}

// Download streams one file of the stopped recording from controld's
// gateway to path on this machine (a temporary file beside it, renamed when
// whole): the MP4 or frames (a tar of the frames directory) of an export
// made first, or the raw trajectory or screencast. It mints a single-use
// recording ticket (CreateRecordingTicket) and spends it on one GET, so it
// works from any machine that reaches the gateway. It returns the bytes
// written.
func (r *Recording) Download(ctx context.Context, file controldv1.RecordingFile, path string) (int64, error) {
	t, err := r.c.sandboxes.CreateRecordingTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: r.id, File: file})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return download(ctx, r.c.gatewayTLSOf(r.id), t.GetUrl(), path)
}

// download GETs url into path, checking the body against Content-Length.
func download(ctx context.Context, tlsCfg *tls.Config, url, path string) (n int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("client: download: %w: %v", errdefs.ErrInvalidArgument, err)
	}
	hc := &http.Client{}
	if tlsCfg != nil {
		hc.Transport = &http.Transport{TLSClientConfig: tlsCfg}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("client: download: %w: %v", errdefs.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return 0, fmt.Errorf("client: download: %w: the gateway refused the ticket (%s)", errdefs.ErrPermissionDenied, resp.Status)
	case resp.StatusCode == http.StatusConflict:
		return 0, fmt.Errorf("client: download: %w: the recording is being exported (%s)", errdefs.ErrFailedPrecondition, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("client: download: %w: the gateway answered %s", errdefs.ErrUnavailable, resp.Status)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.part")
	if err != nil {
		return 0, fmt.Errorf("client: download: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if n, err = io.Copy(f, resp.Body); err != nil {
		return n, fmt.Errorf("client: download: %w: after %d bytes: %v", errdefs.ErrUnavailable, n, err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("client: download: %w: %d of %d bytes", errdefs.ErrUnavailable, n, resp.ContentLength)
	}
	if err = f.Close(); err != nil {
		return n, fmt.Errorf("client: download: %w", err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return n, fmt.Errorf("client: download: %w", err)
	}
	return n, nil
}
