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

// CheckpointRegistry is an optional Runtime extension next to
// CheckpointExporter: a runtime that moves checkpoint images between its
// content store and OCI registries implements it. Without it, push, pull
// and forks of a checkpoint_reference fail with FailedPrecondition.
type CheckpointRegistry interface {
	// PushCheckpoint sends the exported image reference (in the content
	// store) to the registry it names and returns the bytes sent: blobs
	// the registry holds already are not sent again.
	PushCheckpoint(ctx context.Context, reference string) (pushed int64, err error)
	// ResolveCheckpoint returns the manifest digest reference denotes in
	// its registry (one request).
	ResolveCheckpoint(ctx context.Context, reference string) (digest string, err error)
	// PullCheckpoint fetches the checkpoint image reference from its
	// registry into the content store under the name local, every blob
	// verified against its digest. It refuses, before fetching the bulk of
	// it, a checkpoint whose CPU or kernel this host cannot restore
	// (FailedPrecondition). An interrupted pull resumes where it stopped.
	PullCheckpoint(ctx context.Context, reference, local string) (pulled int64, err error)
	// RemoveCheckpointImage deletes the image name from the content store
	// (its blobs go with it unless another image holds them). A missing
	// image is not an error.
	RemoveCheckpointImage(ctx context.Context, name string) error
}
