package client

import (
	"context"

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
