package a11y

import (
	"context"
	"errors"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
)

func errNotFound(format string, args ...any) error {
	return acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "", format, args...)
}

func errNotFoundField(field, format string, args ...any) error {
	return acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, field, format, args...)
}

func errTimeout(format string, args ...any) error {
	return acierr.New(aciv1.ErrorCode_ERROR_CODE_TIMEOUT, "", format, args...)
}

// errTimeoutOr types err: TIMEOUT past a deadline, NOT_FOUND when its
// object is gone, UNAVAILABLE otherwise (the bus failed).
func errTimeoutOr(err error, format string, args ...any) error {
	e := acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", format, args...)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		e.Code = aciv1.ErrorCode_ERROR_CODE_TIMEOUT
	case goneError(err):
		e.Code = aciv1.ErrorCode_ERROR_CODE_NOT_FOUND
	}
	e.Message += ": " + err.Error()
	return e
}
