package runtime

import "context"

// CheckpointExporter is an optional Runtime extension: a runtime that can
// move checkpoints through OCI images implements it, and the manager finds it
// with a type assertion. Without it, Export/ImportCheckpoint fail with
// FailedPrecondition.
type CheckpointExporter interface {
	// ExportCheckpoint writes the checkpoint held by ref as an OCI image
	// named reference into containerd's content store. metadata is
	// controld's own record of the checkpoint (proofs, geometry, lineage),
	// opaque to the runtime: store it in the image and hand it back on import.
	ExportCheckpoint(ctx context.Context, ref CheckpointRef, metadata []byte, reference string) (ExportResult, error)
	// ImportCheckpoint materialises the image named reference as a local
	// checkpoint: its files under dir (which must not exist; the runtime
	// creates it, and removes it on failure) and its writable layer as a
	// committed snapshot. It returns the new ref and the metadata given to
	// ExportCheckpoint. An unknown reference wraps errdefs.ErrNotFound.
	ImportCheckpoint(ctx context.Context, reference, dir string) (CheckpointRef, []byte, error)
}

// ExportResult describes an exported checkpoint image.
type ExportResult struct {
	Reference string
	Digest    string // of the image manifest
	SizeBytes int64
}
