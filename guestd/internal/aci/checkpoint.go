package aci

import (
	"time"

	"github.com/coder/websocket"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

const (
	defaultCheckpointHold = 5 * time.Second
	maxCheckpointHold     = 60 * time.Second
	checkpointCloseGrace  = 50 * time.Millisecond
	// StatusCheckpoint is the close code agents see when their session ends
	// for a checkpoint (1012, Service Restart: reconnecting is the remedy).
	StatusCheckpoint = websocket.StatusCode(1012)
)

// checkpointPrepare closes every session but keep and refuses new agent
// sessions until the hold lifts: CRIU cannot carry an established
// connection from outside the sandbox into a dump, and a client reconnecting
// in the window before the freeze would fail the checkpoint.
func (s *Server) checkpointPrepare(keep *session, req *aciv1.CheckpointPrepareRequest) (*aciv1.CheckpointPrepareResponse, error) {
	hold := time.Duration(req.GetHoldMs()) * time.Millisecond
	switch {
	case hold == 0:
		hold = defaultCheckpointHold
	case hold > maxCheckpointHold:
		return nil, errInvalid("checkpoint_prepare.hold_ms", "at most %d", maxCheckpointHold.Milliseconds())
	}
	s.holdUntil.Store(time.Now().Add(hold).UnixNano())
	s.mu.Lock()
	victims := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		if ss != keep {
			victims = append(victims, ss)
		}
	}
	s.mu.Unlock()
	for _, ss := range victims {
		ss.closeWith(StatusCheckpoint, "checkpoint")
	}
	// Reply only once the sockets are gone, so the caller can dump right
	// after it closes its own session. Peers get a moment to answer the
	// close frame; a checkpoint does not wait for slow ones.
	deadline := time.NewTimer(checkpointCloseGrace)
	defer deadline.Stop()
	for _, ss := range victims {
		select {
		case <-ss.closeDone:
		case <-deadline.C:
		}
		if ss.raw != nil {
			ss.raw.Close()
		} else {
			ss.cancel()
		}
	}
	s.log.Info("checkpoint prepare", "closed_sessions", len(victims), "hold", hold)
	return &aciv1.CheckpointPrepareResponse{ClosedSessions: uint32(len(victims))}, nil
}

// liftHold ends a checkpoint hold (CheckpointDone on the source, Restored on
// a replica).
func (s *Server) liftHold() { s.holdUntil.Store(0) }

// held reports whether new agent sessions are refused for a checkpoint.
func (s *Server) held() bool {
	until := s.holdUntil.Load()
	return until != 0 && time.Now().UnixNano() < until
}
