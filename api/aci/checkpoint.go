package aci

import (
	"context"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// PrepareOption configures CheckpointPrepare.
type PrepareOption func(*aciv1.CheckpointPrepareRequest)

// WithSettle makes CheckpointPrepare wait, after closing the sessions, until
// the screen has been still for quiet (counting from the last damage or
// drawing request, so a still desktop costs no wait), at most bound, before
// it takes the frame hash.
func WithSettle(quiet, bound time.Duration) PrepareOption {
	return func(r *aciv1.CheckpointPrepareRequest) {
		r.SettleMs = uint32(quiet.Milliseconds())
		r.SettleTimeoutMs = uint32(bound.Milliseconds())
	}
}

// CheckpointPrepare closes every other session of the guest and refuses new
// agent sessions for hold (or until CheckpointDone / Restored), so a CRIU
// dump finds no connection from outside the sandbox (controld, admin token
// only). The reply counts the sessions closed and carries the frame hash a
// memory-tier replica is born with.
func (s *Session) CheckpointPrepare(ctx context.Context, hold time.Duration, opts ...PrepareOption) (*aciv1.CheckpointPrepareResponse, error) {
	req := &aciv1.CheckpointPrepareRequest{HoldMs: uint32(hold.Milliseconds())}
	for _, o := range opts {
		o(req)
	}
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{CheckpointPrepare: req}})
	if err != nil {
		return nil, err
	}
	r := m.GetCheckpointPrepare()
	if r == nil {
		return nil, unexpected("checkpoint_prepare", m)
	}
	return r, nil
}

// CheckpointDone lifts a checkpoint hold on the source (admin token only).
func (s *Session) CheckpointDone(ctx context.Context) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointDone{CheckpointDone: &aciv1.CheckpointDoneRequest{}}})
	if err != nil {
		return err
	}
	if m.GetCheckpointDone() == nil {
		return unexpected("checkpoint_done", m)
	}
	return nil
}

// ResumeApps lets the apps a replica's Restored (hold_apps) kept stopped
// run (admin token only). It returns how many processes it continued: 0
// when none were held.
func (s *Session) ResumeApps(ctx context.Context) (uint32, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ResumeApps{ResumeApps: &aciv1.ResumeAppsRequest{}}})
	if err != nil {
		return 0, err
	}
	r := m.GetResumeApps()
	if r == nil {
		return 0, unexpected("resume_apps", m)
	}
	return r.GetResumed(), nil
}

// ReleaseScratch gives the guest's idle scratch memory (capture segments,
// freed heap) back to the kernel, as before freezing a replica (admin token
// only). It returns the capture-segment bytes released.
func (s *Session) ReleaseScratch(ctx context.Context) (uint64, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ReleaseScratch{ReleaseScratch: &aciv1.ReleaseScratchRequest{}}})
	if err != nil {
		return 0, err
	}
	r := m.GetReleaseScratch()
	if r == nil {
		return 0, unexpected("release_scratch", m)
	}
	return r.GetReleasedBytes(), nil
}
