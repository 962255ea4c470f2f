package fleet

import (
	"context"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Recordings is what the manager needs of controld's recorder
// (controld/internal/recording implements it): the recording RPCs, which
// sandbox is recording (its endpoint then sends agents through the gateway,
// where the trajectory is read), and the recordings of a fork's replicas.
type Recordings interface {
	Start(context.Context, *controldv1.StartRecordingRequest) (*controldv1.StartRecordingResponse, error)
	Stop(context.Context, *controldv1.StopRecordingRequest) (*controldv1.StopRecordingResponse, error)
	Get(context.Context, *controldv1.GetRecordingRequest) (*controldv1.GetRecordingResponse, error)
	List(context.Context, *controldv1.ListRecordingsRequest) (*controldv1.ListRecordingsResponse, error)
	Export(context.Context, *controldv1.ExportRecordingRequest) (*controldv1.ExportRecordingResponse, error)
	Delete(context.Context, *controldv1.DeleteRecordingRequest) (*controldv1.DeleteRecordingResponse, error)
	// CreateTicket mints a download ticket (the gateway serves the file).
	CreateTicket(context.Context, *controldv1.CreateRecordingTicketRequest) (*controldv1.CreateRecordingTicketResponse, error)
	// Active is the sandbox's running recording ("" when none).
	Active(sandboxID string) string
	// Forked starts the replicas' recordings (when record, or when the
	// source sandbox is recording) and returns them by replica id.
	Forked(checkpointID, sourceSandboxID string, replicas []string, record bool) map[string]string
}

func (m *sandboxer) recordings() (Recordings, error) {
	if m.opts.Recordings == nil {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "RECORDING_DISABLED", "this controld does not record sandboxes")
	}
	return m.opts.Recordings, nil
}

// recording reports whether a sandbox is being recorded.
func (m *sandboxer) recording(id string) bool {
	return m.opts.Recordings != nil && m.opts.Recordings.Active(id) != ""
}

func (m *sandboxer) StartRecording(ctx context.Context, req *controldv1.StartRecordingRequest) (*controldv1.StartRecordingResponse, error) {
	r, err := m.recordings()
	if err != nil {
		return nil, err
	}
	return r.Start(ctx, req)
}

func (m *sandboxer) StopRecording(ctx context.Context, req *controldv1.StopRecordingRequest) (*controldv1.StopRecordingResponse, error) {
	r, err := m.recordings()
	if err != nil {
		return nil, err
	}
	return r.Stop(ctx, req)
}

func (m *sandboxer) GetRecording(ctx context.Context, req *controldv1.GetRecordingRequest) (*controldv1.GetRecordingResponse, error) {
	r, err := m.recordings()
	if err != nil {
		return nil, err
	}
	return r.Get(ctx, req)
}

func (m *sandboxer) ListRecordings(ctx context.Context, req *controldv1.ListRecordingsRequest) (*controldv1.ListRecordingsResponse, error) {
	r, err := m.recordings()
	if err != nil {
		return nil, err
	}
	return r.List(ctx, req)
}

func (m *sandboxer) ExportRecording(ctx context.Context, req *controldv1.ExportRecordingRequest) (*controldv1.ExportRecordingResponse, error) {
	r, err := m.recordings()
	if err != nil {
		return nil, err
	}
	return r.Export(ctx, req)
}

func (m *sandboxer) DeleteRecording(ctx context.Context, req *controldv1.DeleteRecordingRequest) (*controldv1.DeleteRecordingResponse, error) {
	r, err := m.recordings()
	if err != nil {
		return nil, err
	}
	return r.Delete(ctx, req)
}

// recordForked starts the recordings of a fork's usable replicas.
func (m *sandboxer) recordForked(checkpointID, source string, out []*controldv1.ForkReplica, record bool) {
	if m.opts.Recordings == nil {
		return
	}
	var ids []string
	for _, r := range out {
		if id := r.GetSandbox().GetId(); id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	recs := m.opts.Recordings.Forked(checkpointID, source, ids, record)
	for _, r := range out {
		if rc := recs[r.GetSandbox().GetId()]; rc != "" && r.Endpoint != nil {
			r.RecordingId = rc
			// The replica records: its agents go through the gateway.
			r.Endpoint.UnixPath, r.Endpoint.UnixPidStart = "", 0
		}
	}
}

func (m *sandboxer) CreateRecordingTicket(ctx context.Context, req *controldv1.CreateRecordingTicketRequest) (*controldv1.CreateRecordingTicketResponse, error) {
	r, err := m.recordings()
	if err != nil {
		return nil, err
	}
	return r.CreateTicket(ctx, req)
}
