// Package errdefs holds forkfleet's error classes. It has no transport: the
// conversion to and from gRPC status lives in errdefs/errgrpc, done once at
// the server boundary and once in the client, so both sides test errors with
// errors.Is and small binaries (guestd) use the classes without gRPC.
package errdefs

import (
	"errors"
	"fmt"
)

// Domain is the ErrorInfo domain of forkfleet's errors.
const Domain = "forkfleet.dev"

// Error classes. Wrap them (fmt.Errorf("sandbox %q: %w", id, ErrNotFound)) or
// use the constructors below; test with errors.Is.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrCanceled           = errors.New("canceled")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrInternal           = errors.New("internal")
)

// FieldError is an invalid request field.
type FieldError struct {
	Field  string // dotted path, e.g. "resources.memory_bytes"
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrInvalidArgument) true for a FieldError.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidArgument }

// ErrorField returns the field, for Field.
func (e *FieldError) ErrorField() string { return e.Field }

// InvalidField returns an ErrInvalidArgument naming the field at fault.
func InvalidField(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ReasonError attaches a machine-readable reason ("SANDBOX_NOT_FOUND") to an
// error class; the reason travels as google.rpc.ErrorInfo.
type ReasonError struct {
	Class  error
	Reason string
	Msg    string
}

func (e *ReasonError) Error() string { return e.Msg }

func (e *ReasonError) Unwrap() error { return e.Class }

// ErrorReason returns the reason, for Reason.
func (e *ReasonError) ErrorReason() string { return e.Reason }

// WithReason builds a ReasonError.
func WithReason(class error, reason, format string, args ...any) error {
	return &ReasonError{Class: class, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// Field returns the request field an InvalidArgument names, if any: a
// local FieldError's, or the one a remote error carried.
func Field(err error) string {
	var f interface{ ErrorField() string }
	if errors.As(err, &f) {
		return f.ErrorField()
	}
	return ""
}

// Reason returns the machine-readable reason of err, if any.
func Reason(err error) string {
	var r interface{ ErrorReason() string }
	if errors.As(err, &r) {
		return r.ErrorReason()
	}
	return ""
}
