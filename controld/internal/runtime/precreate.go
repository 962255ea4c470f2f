package runtime

import "context"

// Precreator is an optional Runtime extension: a runtime that can create a
// sandbox ahead of its request (snapshot, container and task made, task not
// started) implements it, and the manager finds it with a type assertion.
// Without it, warm slots are off.
type Precreator interface {
	// Precreate does everything Boot(spec) does except starting the task. A
	// later Boot with an identical spec only starts it; a Boot with another
	// spec for the same id removes it and boots normally.
	Precreate(ctx context.Context, spec BootSpec) error
	// Discard removes a sandbox precreated and never booted. It never
	// touches a booted sandbox: an id that is not precreated is
	// errdefs.ErrNotFound.
	Discard(ctx context.Context, id string) error
}

// RestorePrecreator is the Precreator extension for forks: a runtime that
// can create a fork of a checkpoint ahead of its request (snapshot on the
// checkpoint's layer, container, shim holding the restore options) so that
// only the start (runc restore) remains. Discard removes such a sandbox too.
type RestorePrecreator interface {
	Precreator
	// PrecreateRestore does everything Restore(spec, from) does except the
	// start. A later Restore with identical arguments only starts it; one
	// with other arguments for the same id removes it and restores anew.
	PrecreateRestore(ctx context.Context, spec BootSpec, from CheckpointRef) error
}
