package aci

import (
	"context"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// CheckpointPrepare closes every other session of the guest and refuses new
// agent sessions for hold (or until CheckpointDone / Restored), so a CRIU
// dump finds no connection from outside the sandbox (controld, admin token
// only). It returns the number of sessions closed.
func (s *Session) CheckpointPrepare(ctx context.Context, hold time.Duration) (int, error) {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_CheckpointPrepare{
		CheckpointPrepare: &aciv1.CheckpointPrepareRequest{HoldMs: uint32(hold.Milliseconds())}}})
	if err != nil {
		return 0, err
	}
	r := m.GetCheckpointPrepare()
	if r == nil {
		return 0, unexpected("checkpoint_prepare", m)
	}
	return int(r.GetClosedSessions()), nil
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
