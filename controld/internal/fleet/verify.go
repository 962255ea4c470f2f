package fleet

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// verifier runs the proofs that a sandbox is the checkpoint it was forked
// from: on request (VerifySandbox) and on every fresh replica (fork.go).
type verifier struct {
	*registry
}

// VerifySandbox runs the verifiers of the sandbox's checkpoint against it.
func (m *Manager) VerifySandbox(ctx context.Context, req *controldv1.VerifySandboxRequest) ([]*controldv1.VerifyResult, error) {
	return m.verifier.sandbox(ctx, req)
}

func (m *verifier) sandbox(ctx context.Context, req *controldv1.VerifySandboxRequest) ([]*controldv1.VerifyResult, error) {
	if err := rules.SandboxID("id", req.GetId()); err != nil {
		return nil, err
	}
	sb, err := m.lookup(req.GetId())
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	rec := cloneRecord(sb.rec)
	m.mu.Unlock()
	if rec.Sandbox.CheckpointId == "" {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "NOT_A_FORK", "sandbox %s was not forked from a checkpoint", rec.Sandbox.Id)
	}
	ck, err := m.findCheckpoint(rec.Sandbox.CheckpointId)
	if err != nil {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_GONE", "checkpoint %s of sandbox %s no longer exists", rec.Sandbox.CheckpointId, rec.Sandbox.Id)
	}
	levels, err := rules.VerifyLevels("levels", req.GetLevels(), ck.Checkpoint.VerifyLevels)
	if err != nil {
		return nil, err
	}
	if rec.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_WRONG_STATE", "sandbox %s is %s, must be READY", rec.Sandbox.Id, rec.Sandbox.State)
	}
	g, err := m.dialGuest(ctx, rec.ACISocket, rec.AdminToken)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	return m.verify(ctx, g, rec.Sandbox.Id, ck, levels, nil), nil
}

// verify runs the requested verifiers; each reports its own outcome, in
// the order of levels. They are independent reads over one session (Guest
// methods may be called concurrently), so they run at once: a fork is
// usable after the slowest proof, not after their sum. born, for a fresh
// replica, delivers the hash of its first frame from Restored (see
// verifyPixels).
func (m *verifier) verify(ctx context.Context, g Guest, id string, ck *store.CheckpointRecord, levels []controldv1.VerifyLevel, born <-chan []byte) []*controldv1.VerifyResult {
	out := make([]*controldv1.VerifyResult, len(levels))
	done := make(chan struct{}, len(levels))
	for i, l := range levels {
		go func() {
			defer func() { done <- struct{}{} }()
			start := time.Now()
			ok, detail := m.verifyOne(ctx, g, id, ck, l, born)
			out[i] = &controldv1.VerifyResult{Level: l, Ok: ok, Detail: detail, Took: durationpb.New(time.Since(start))}
		}()
	}
	for range levels {
		<-done
	}
	return out
}

func (m *verifier) verifyOne(ctx context.Context, g Guest, id string, ck *store.CheckpointRecord, l controldv1.VerifyLevel, born <-chan []byte) (bool, string) {
	ctx, span := m.tracer.Start(ctx, "verify."+l.String())
	defer span.End()
	switch l {
	case controldv1.VerifyLevel_VERIFY_LEVEL_MARKER:
		got, err := g.GetFile(ctx, ck.MarkerPath)
		if err != nil {
			return false, fmt.Sprintf("read %s: %v", ck.MarkerPath, err)
		}
		if !bytes.Equal(got, ck.MarkerValue) {
			return false, fmt.Sprintf("%s holds %d bytes that differ from the marker written at checkpoint", ck.MarkerPath, len(got))
		}
		return true, "marker file reads back"
	case controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY:
		nonce := randomBytes(32)
		got, err := g.MemoryChallenge(ctx, nonce)
		if err != nil {
			return false, fmt.Sprintf("memory challenge: %v", err)
		}
		if !wire.ProofOK(ck.MemoryValue, nonce, got) {
			return false, "memory challenge answer does not match the value marked before the checkpoint"
		}
		return true, "in-memory value answers a fresh challenge"
	case controldv1.VerifyLevel_VERIFY_LEVEL_PIXELS:
		return m.verifyPixels(ctx, g, ck, born)
	case controldv1.VerifyLevel_VERIFY_LEVEL_NETWORK:
		nonce := randomBytes(32)
		got, err := g.NetProbe(ctx, ck.NetPort, nonce)
		if err != nil {
			return false, fmt.Sprintf("connect to the restored listener 127.0.0.1:%d from inside the replica: %v", ck.NetPort, err)
		}
		if !wire.ProofOK(ck.NetValue, nonce, got) {
			return false, fmt.Sprintf("the listener on 127.0.0.1:%d answered, but not with the checkpoint's value", ck.NetPort)
		}
		return true, fmt.Sprintf("the restored listener on 127.0.0.1:%d accepts over the replica's loopback", ck.NetPort)
	case controldv1.VerifyLevel_VERIFY_LEVEL_FILESYSTEM:
		d, ok := runtime.As[runtime.LayerDigester](m.rt)
		if !ok {
			return false, "the runtime cannot digest a sandbox's files"
		}
		got, err := d.LayerDigest(ctx, id)
		if err != nil {
			return false, fmt.Sprintf("filesystem digest: %v", err)
		}
		if !bytes.Equal(got, ck.FSDigest) {
			return false, fmt.Sprintf("filesystem digest %x differs from %x at checkpoint", got, ck.FSDigest)
		}
		return true, "the files outside volatile paths are the checkpoint's"
	}
	return false, fmt.Sprintf("unknown level %s", l)
}

// verifyPixels proves the replica's screen is the checkpoint's. A fresh
// replica reports its first frame with Restored: guestd captured it under
// the X server grab the dump carried, before any app of the replica drew,
// so it is the exact frame of the checkpoint on a page that animates too,
// and any difference fails. Without it (a live replica re-verified, or a
// checkpoint whose guestd predates the grab) the replica's current screen
// is compared: at once, then after it has been still for FrameSettle.
func (m *verifier) verifyPixels(ctx context.Context, g Guest, ck *store.CheckpointRecord, born <-chan []byte) (bool, string) {
	if born != nil {
		var first []byte
		select {
		case first = <-born:
		case <-ctx.Done():
			return false, fmt.Sprintf("first frame: %v", ctx.Err())
		}
		if len(first) > 0 {
			if !bytes.Equal(first, ck.FrameHash) {
				return false, fmt.Sprintf("first frame hash %x differs from %x recorded at checkpoint", first, ck.FrameHash)
			}
			return true, "first frame hash equals the checkpoint's"
		}
	}
	{
		got, err := g.FrameHash(ctx, 0)
		if err == nil && bytes.Equal(got, ck.FrameHash) {
			return true, "frame hash equals the checkpoint's"
		}
		got, err = g.FrameHash(ctx, m.opts.FrameSettle)
		if err != nil {
			return false, fmt.Sprintf("frame hash: %v", err)
		}
		if !bytes.Equal(got, ck.FrameHash) {
			return false, fmt.Sprintf("settled frame hash %x differs from %x recorded at checkpoint", got, ck.FrameHash)
		}
		return true, "settled frame hash equals the checkpoint's"
	}
}
