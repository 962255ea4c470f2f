package controldfake

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
)

// Recordings in the fake follow controld's rules (api/rules: validation,
// refusals, paging) and lifecycle (one running per sandbox, stopped when
// the sandbox goes, replicas of a recorded source recorded), but hold no
// frames and no trajectory: nothing streams in the fake. An export is
// therefore RECORDING_EMPTY, as controld's is for a recording without a
// frame.

func (f *Fake) activeRecording(sandboxID string) *controldv1.Recording {
	for _, r := range f.recordings {
		if r.GetSandboxId() == sandboxID && r.GetState() == controldv1.RecordingState_RECORDING_STATE_RECORDING {
			return r
		}
	}
	return nil
}

// startRecording adds a running recording. f.mu held.
func (f *Fake) startRecording(sandboxID string, maxBytes uint64) *controldv1.Recording {
	if f.recordings == nil {
		f.recordings = map[string]*controldv1.Recording{}
	}
	id := rules.NewID(rules.PrefixRecording)
	r := &controldv1.Recording{Id: id, SandboxId: sandboxID, State: controldv1.RecordingState_RECORDING_STATE_RECORDING,
		StartedAt: timestamppb.Now(), MaxBytes: maxBytes, Dir: "/var/lib/forkfleet/fake/recordings/" + id}
	f.recordings[id] = r
	return r
}

func stopRecording(r *controldv1.Recording, reason controldv1.RecordingStopReason) {
	r.State = controldv1.RecordingState_RECORDING_STATE_STOPPED
	r.StoppedAt = timestamppb.Now()
	r.StopReason = reason
}

func (f *Fake) getRecording(id string) (*controldv1.Recording, error) {
	if err := rules.RecordingID("id", id); err != nil {
		return nil, err
	}
	r := f.recordings[id]
	if r == nil {
		return nil, rules.RecordingNotFound(id)
	}
	return r, nil
}

func (f *Fake) StartRecording(ctx context.Context, req *controldv1.StartRecordingRequest) (*controldv1.StartRecordingResponse, error) {
	maxBytes, err := rules.StartRecording(req)
	if err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.getSandboxField("sandbox_id", req.GetSandboxId()); err != nil {
		return nil, rpcErr(err)
	}
	if r := f.activeRecording(req.GetSandboxId()); r != nil {
		return nil, rpcErr(rules.SandboxRecording(req.GetSandboxId(), r.GetId()))
	}
	return &controldv1.StartRecordingResponse{Recording: proto.CloneOf(f.startRecording(req.GetSandboxId(), maxBytes))}, nil
}

func (f *Fake) StopRecording(ctx context.Context, req *controldv1.StopRecordingRequest) (*controldv1.StopRecordingResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.getRecording(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	if r.GetState() == controldv1.RecordingState_RECORDING_STATE_RECORDING {
		stopRecording(r, controldv1.RecordingStopReason_RECORDING_STOP_REASON_REQUESTED)
	}
	return &controldv1.StopRecordingResponse{Recording: proto.CloneOf(r)}, nil
}

func (f *Fake) GetRecording(ctx context.Context, req *controldv1.GetRecordingRequest) (*controldv1.GetRecordingResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.getRecording(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.GetRecordingResponse{Recording: proto.CloneOf(r)}, nil
}

func (f *Fake) ListRecordings(ctx context.Context, req *controldv1.ListRecordingsRequest) (*controldv1.ListRecordingsResponse, error) {
	if err := rules.ListRecordings(req); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	var all []*controldv1.Recording
	for _, r := range f.recordings {
		if req.GetSandboxId() == "" || r.GetSandboxId() == req.GetSandboxId() {
			all = append(all, proto.CloneOf(r))
		}
	}
	f.mu.Unlock()
	page, next, err := rules.Page(all, rules.RecordingKey, req.GetPageSize(), req.GetPageToken(), req)
	if err != nil {
		return nil, rpcErr(err)
	}
	return &controldv1.ListRecordingsResponse{Recordings: page, NextPageToken: next}, nil
}

func (f *Fake) ExportRecording(ctx context.Context, req *controldv1.ExportRecordingRequest) (*controldv1.ExportRecordingResponse, error) {
	if _, err := rules.ExportRecording(req); err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.getRecording(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	if r.GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED {
		return nil, rpcErr(rules.RecordingRunning(r.GetId()))
	}
	return nil, rpcErr(rules.RecordingEmpty(r.GetId()))
}

func (f *Fake) DeleteRecording(ctx context.Context, req *controldv1.DeleteRecordingRequest) (*controldv1.DeleteRecordingResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.getRecording(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	if r.GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED {
		return nil, rpcErr(rules.RecordingRunning(r.GetId()))
	}
	delete(f.recordings, r.GetId())
	return &controldv1.DeleteRecordingResponse{}, nil
}

// CreateRecordingTicket validates as controld does (rules.RecordingTicket)
// and returns a ticket on the fake gateway host; nothing serves it. The
// fake never exports, so MP4 and FRAMES are RECORDING_NOT_EXPORTED.
func (f *Fake) CreateRecordingTicket(ctx context.Context, req *controldv1.CreateRecordingTicketRequest) (*controldv1.CreateRecordingTicketResponse, error) {
	ttl, err := rules.RecordingTicket(req)
	if err != nil {
		return nil, rpcErr(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.getRecording(req.GetId())
	if err != nil {
		return nil, rpcErr(err)
	}
	if r.GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED {
		return nil, rpcErr(rules.RecordingRunning(r.GetId()))
	}
	switch req.GetFile() {
	case controldv1.RecordingFile_RECORDING_FILE_MP4, controldv1.RecordingFile_RECORDING_FILE_FRAMES:
		return nil, rpcErr(rules.RecordingNotExported(r.GetId(), req.GetFile()))
	}
	name := rules.RecordingFileName(req.GetFile())
	ticket := rand.Text()
	return &controldv1.CreateRecordingTicketResponse{
		Url:       fmt.Sprintf("http://fake-gateway/v1/recordings/%s/files/%s?ticket=%s", r.GetId(), name, ticket),
		Ticket:    ticket,
		ExpiresAt: timestamppb.New(time.Now().Add(ttl)),
		Name:      name,
	}, nil
}
