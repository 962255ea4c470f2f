package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"golang.org/x/sync/singleflight"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// transfer moves checkpoints in and out of this host: export and import as
// OCI images, push and pull through registries (checkpoint_registry.go),
// and the one pull and import that concurrent forks of a registry
// reference share. It works over the checkpoints concern (and through it
// the registry), reached through m; the manager's RPCs of it delegate here.
type transfer struct {
	m *checkpointer
	// pulls shares one pull and import per manifest digest among
	// concurrent forks of a registry checkpoint.
	pulls singleflight.Group
}

// ExportCheckpoint writes a checkpoint as an OCI image (runtime
// permitting), and pushes it when asked.
func (m *Manager) ExportCheckpoint(ctx context.Context, req *controldv1.ExportCheckpointRequest) (*controldv1.ExportCheckpointResponse, error) {
	return m.transfer.export(ctx, req)
}

// ImportCheckpoint materialises an exported checkpoint image as a new local
// checkpoint, pulling it from its registry first when asked.
func (m *Manager) ImportCheckpoint(ctx context.Context, req *controldv1.ImportCheckpointRequest) (*controldv1.ImportCheckpointResponse, error) {
	return m.transfer.importRequest(ctx, req)
}

// exportedCheckpoint is the metadata an exported checkpoint image carries.
// Not the checkpoint's hot set (lazy restore's working set, persisted in the
// runtime's own state): it is this host's, learned from what the sandbox
// touched, and an import (a new directory) learns its own at its first lazy
// fork (controld/docs/forks.md, "Lazy restore").
type exportedCheckpoint struct {
	Version int                     `json:"version"`
	Record  *store.CheckpointRecord `json:"record"`
}

// export writes a checkpoint as an OCI image (runtime permitting).
func (t *transfer) export(ctx context.Context, req *controldv1.ExportCheckpointRequest) (*controldv1.ExportCheckpointResponse, error) {
	m := t.m
	if err := rules.CheckpointRef("id", req.GetId()); err != nil {
		return nil, err
	}
	if req.GetReference() == "" {
		return nil, errdefs.InvalidField("reference", "required")
	}
	if err := rules.Image("reference", req.GetReference()); err != nil {
		return nil, err
	}
	c, err := m.findCheckpoint(req.GetId())
	if err != nil {
		return nil, err
	}
	ex, err := exporterOf(m.rt)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	rec := cloneCheckpoint(c)
	m.mu.Unlock()
	rec.Checkpoint.ChildIds = nil
	meta, err := json.Marshal(exportedCheckpoint{Version: 1, Record: rec})
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: encode metadata: %w", rec.Checkpoint.Id, err)
	}
	ctx, span := m.tracer.Start(ctx, "checkpoint.export")
	defer span.End()
	var reg runtime.CheckpointRegistry
	if req.GetPush() {
		if reg, err = registryOf(m.rt); err != nil {
			return nil, err
		}
	}
	res, err := ex.ExportCheckpoint(ctx, rec.Ref, meta, req.GetReference())
	if err != nil {
		return nil, fmt.Errorf("export checkpoint %s: %w", rec.Checkpoint.Id, err)
	}
	resp := &controldv1.ExportCheckpointResponse{Reference: res.Reference, Digest: res.Digest, SizeBytes: res.SizeBytes}
	if reg != nil {
		if resp.PushedBytes, err = t.push(ctx, reg, req.GetReference()); err != nil {
			return nil, fmt.Errorf("push checkpoint %s: %w", rec.Checkpoint.Id, err)
		}
	}
	return resp, nil
}

// importRequest materialises an exported checkpoint image as a new local
// checkpoint (a new id; proofs, labels and name kept), pulling it from its
// registry first when asked.
func (t *transfer) importRequest(ctx context.Context, req *controldv1.ImportCheckpointRequest) (*controldv1.ImportCheckpointResponse, error) {
	m := t.m
	if req.GetReference() == "" {
		return nil, errdefs.InvalidField("reference", "required")
	}
	if err := rules.Image("reference", req.GetReference()); err != nil {
		return nil, err
	}
	resp := &controldv1.ImportCheckpointResponse{}
	if req.GetPull() {
		reg, err := registryOf(m.rt)
		if err != nil {
			return nil, err
		}
		resp.PulledBytes, err = t.pull(ctx, reg, req.GetReference())
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", req.GetReference(), err)
		}
	}
	ck, err := t.importImage(ctx, req.GetReference(), "")
	if err != nil {
		return nil, err
	}
	resp.Checkpoint = ck
	return resp, nil
}

// importImage imports the image name from the content store. With
// digest (a fork's import of a registry checkpoint) the checkpoint is a
// cache of that image: it takes no name and records the digest.
func (t *transfer) importImage(ctx context.Context, name, digest string) (*controldv1.Checkpoint, error) {
	m := t.m
	ex, err := exporterOf(m.rt)
	if err != nil {
		return nil, err
	}
	ctx, span := m.tracer.Start(ctx, "checkpoint.import")
	defer span.End()
	id := rules.NewID(rules.PrefixCheckpoint)
	tmp := m.tmpCheckpointDir(id)
	ref, meta, err := ex.ImportCheckpoint(ctx, name, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	var ec exportedCheckpoint
	if err := json.Unmarshal(meta, &ec); err != nil || ec.Record == nil || ec.Record.Checkpoint == nil {
		m.dropRuntimeCheckpoint(ref, tmp)
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "NOT_A_CHECKPOINT_IMAGE",
			"%s carries no forkfleet checkpoint metadata", name)
	}
	final := m.checkpointDirFor(id)
	if err := os.Rename(tmp, final); err != nil {
		m.dropRuntimeCheckpoint(ref, tmp)
		return nil, fmt.Errorf("import %s: publish dir: %w", name, err)
	}
	if err := syncDir(m.opts.CheckpointDir); err != nil {
		m.dropRuntimeCheckpoint(ref, final)
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	if ref.Dir == "" || ref.Dir == tmp {
		ref.Dir = final
	}
	rec := ec.Record
	rec.Ref = ref
	rec.Checkpoint.Id = id
	rec.Checkpoint.ChildIds = nil
	rec.Checkpoint.LiveForks = 0
	rec.Checkpoint.State = controldv1.CheckpointState_CHECKPOINT_STATE_READY
	rec.ImportedDigest = ""
	if digest != "" {
		rec.Checkpoint.Name, rec.ImportedDigest = "", digest
	}
	m.mu.Lock()
	if _, ok := m.checkpoints[rec.Checkpoint.ParentCheckpointId]; !ok {
		rec.Checkpoint.ParentCheckpointId = ""
	}
	m.mu.Unlock()
	if err := m.commitCheckpoint(rec); err != nil {
		m.dropRuntimeCheckpoint(ref, final)
		return nil, err
	}
	// Its first fork finds a container precreated too, as a local
	// checkpoint's does.
	m.forkSlotsExpect(id)
	return m.checkpointView(id)
}

func exporterOf(rt runtime.Runtime) (runtime.CheckpointExporter, error) {
	if ex, ok := runtime.As[runtime.CheckpointExporter](rt); ok {
		return ex, nil
	}
	return nil, errNoExport
}

// errNoExport is returned when the runtime does not implement CheckpointExporter.
var errNoExport = errdefs.WithReason(errdefs.ErrFailedPrecondition, "EXPORT_UNSUPPORTED", "runtime does not support export")
