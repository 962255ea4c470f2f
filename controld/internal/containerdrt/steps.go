//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// The long operations (Checkpoint, ExportCheckpoint, ImportCheckpoint, a
// fork's createRestore, PullCheckpoint) are written as named steps over one value holding the operation's state, as
// containerd's client composes a checkpoint from options: each step does
// one thing and records what it made, and the operation's finish undoes,
// when a later step fails, what the earlier ones left.

// step is one part of a long operation.
type step func(context.Context) error

// runSteps runs steps in order and stops at the first error.
func runSteps(ctx context.Context, steps ...step) error {
	for _, s := range steps {
		if err := s(ctx); err != nil {
			return err
		}
	}
	return nil
}

// makeCheckpointDir creates a checkpoint directory, which must not exist:
// an existing one is someone else's and is left alone.
func makeCheckpointDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("checkpoint dir: %w: %w", errdefs.ErrInternal, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("checkpoint dir %s: %w", dir, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("checkpoint dir: %w: %w", errdefs.ErrInternal, err)
	}
	return nil
}
