package app

import (
	"io"
	"log/slog"

	"github.com/forkfleet/forkfleet/controld/internal/config"
)

// NewLogger returns controld's logger: records at or above cfg's level, as
// text (key=value) or JSON lines on w. The runtime asks CRIU for verbose
// dump logs when this logger is at debug.
func NewLogger(cfg config.Log, w io.Writer) (*slog.Logger, error) {
	level, err := cfg.SlogLevel()
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}
