package errdefs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

func TestLocalFieldAndReason(t *testing.T) {
	err := fmt.Errorf("create: %w", errdefs.InvalidField("screen.width", "must be 64..8192, got %d", 10))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "screen.width" || errdefs.Reason(err) != "" {
		t.Errorf("field error = %v, field %q", err, errdefs.Field(err))
	}
	err = fmt.Errorf("get: %w", errdefs.WithReason(errdefs.ErrNotFound, "SANDBOX_NOT_FOUND", "sandbox %q not found", "sb-1"))
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Reason(err) != "SANDBOX_NOT_FOUND" || errdefs.Field(err) != "" {
		t.Errorf("reason error = %v, reason %q", err, errdefs.Reason(err))
	}
	if errdefs.Field(errors.New("plain")) != "" || errdefs.Reason(nil) != "" {
		t.Error("plain errors carry no field or reason")
	}
}
