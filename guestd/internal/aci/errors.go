package aci

import (
	"errors"

	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
)

// toError maps any error from a Desktop, the encoder or sysops to a typed
// ACI error, naming field when the error does not name one itself.
func toError(err error, field string) *aciv1.Error {
	if err == nil {
		return nil
	}
	code := aciv1.ErrorCode_ERROR_CODE_UNSPECIFIED
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		code = aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT
	case errors.Is(err, errdefs.ErrNotFound):
		code = aciv1.ErrorCode_ERROR_CODE_NOT_FOUND
	case errors.Is(err, errdefs.ErrUnavailable):
		code = aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE
	case errors.Is(err, errdefs.ErrDeadlineExceeded):
		code = aciv1.ErrorCode_ERROR_CODE_TIMEOUT
	}
	e := acierr.From(err)
	if code != aciv1.ErrorCode_ERROR_CODE_UNSPECIFIED {
		e = &acierr.Error{Code: code, Message: err.Error(), Field: e.Field}
	}
	p := e.Proto()
	if p.Field == "" {
		p.Field = field
	}
	return p
}

func errInvalid(field, format string, args ...any) *acierr.Error {
	return acierr.Invalid(field, format, args...)
}

var errNoDesktop = acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "the display is not up yet (wait for the ReadyEvent)")
