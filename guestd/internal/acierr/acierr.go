// Package acierr is the typed error of the ACI: a code from the protocol, a
// human message and the request field at fault. Packages that serve ACI
// requests return *Error; the dispatcher turns any other error into
// ERROR_CODE_INTERNAL (or a mapped code, see FromOS).
package acierr

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Error is one typed ACI failure.
type Error struct {
	Code    aciv1.ErrorCode
	Message string
	Field   string
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s (field %s)", e.Code, e.Message, e.Field)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Proto converts e into the wire message.
func (e *Error) Proto() *aciv1.Error {
	return &aciv1.Error{Code: e.Code, Message: e.Message, Field: e.Field}
}

// New builds an *Error.
func New(code aciv1.ErrorCode, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Invalid is INVALID_ARGUMENT for field.
func Invalid(field, format string, args ...any) *Error {
	return New(aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field, format, args...)
}

// WithField returns err with its field set when it is an *Error without one;
// other errors are converted first with From.
func WithField(err error, field string) *Error {
	e := From(err)
	if e.Field == "" {
		c := *e
		c.Field = field
		return &c
	}
	return e
}

// From converts any error into an *Error: an *Error as is, context errors to
// CANCELED/TIMEOUT, file system errors by errno, anything else INTERNAL.
func From(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if code, ok := osCode(err); ok {
		return &Error{Code: code, Message: err.Error()}
	}
	return &Error{Code: aciv1.ErrorCode_ERROR_CODE_INTERNAL, Message: err.Error()}
}

func osCode(err error) (aciv1.ErrorCode, bool) {
	switch {
	case errors.Is(err, context.Canceled):
		return aciv1.ErrorCode_ERROR_CODE_CANCELED, true
	case errors.Is(err, context.DeadlineExceeded):
		return aciv1.ErrorCode_ERROR_CODE_TIMEOUT, true
	case errors.Is(err, fs.ErrNotExist):
		return aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, true
	case errors.Is(err, fs.ErrExist):
		return aciv1.ErrorCode_ERROR_CODE_ALREADY_EXISTS, true
	case errors.Is(err, fs.ErrPermission):
		return aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, true
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOTDIR, syscall.EISDIR, syscall.ENOTEMPTY, syscall.EBUSY, syscall.EXDEV, syscall.ELOOP:
			return aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, true
		case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM:
			return aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED, true
		case syscall.ENAMETOOLONG, syscall.EINVAL:
			return aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, true
		case syscall.EROFS:
			return aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, true
		}
	}
	return 0, false
}
