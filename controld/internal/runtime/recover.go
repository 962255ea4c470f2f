package runtime

import "context"

// CheckpointRecoverer is an optional Runtime extension for runtimes whose
// checkpoint work outlives controld and holds runtime resources outside the
// checkpoint directory (containerdrt: runc and CRIU run under containerd's
// shim and finish a dump after controld died; the uncommitted layer is held
// by a lease). The manager finds it with a type assertion and calls it
// first at reconciliation, before it removes interrupted checkpoint
// directories and thaws sandboxes an interrupted checkpoint left frozen.
type CheckpointRecoverer interface {
	// RecoverCheckpoints waits (bounded) for dumps a previous controld
	// started and no longer awaits, then releases what unfinished
	// checkpoints hold in the runtime: uncommitted layers and their leases,
	// work files, and committed checkpoint layers no ref in keep names
	// (and whatever else a killed controld left in the runtime: containerdrt
	// removes writable layers without a container here).
	// keep lists every checkpoint controld has a record of. It is called
	// only when nothing of this controld is in flight.
	RecoverCheckpoints(ctx context.Context, keep []CheckpointRef) error
}
