package fleet

import (
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// errNoExport is returned when the runtime does not implement CheckpointExporter.
var errNoExport = errdefs.WithReason(errdefs.ErrFailedPrecondition, "EXPORT_UNSUPPORTED", "runtime does not support export")

func exporterOf(rt runtime.Runtime) (runtime.CheckpointExporter, error) {
	if ex, ok := runtime.As[runtime.CheckpointExporter](rt); ok {
		return ex, nil
	}
	return nil, errNoExport
}
