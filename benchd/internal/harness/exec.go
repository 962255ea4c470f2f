//go:build linux

package harness

import (
	"context"
	"os/exec"
)

func execCommand(ctx context.Context, argv ...string) *exec.Cmd {
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}
