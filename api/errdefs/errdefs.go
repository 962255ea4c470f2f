// Package errdefs holds forkfleet's error classes and their conversion to and
// from gRPC status, done once at the server boundary and once in the client,
// so both sides test errors with errors.Is.
package errdefs

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
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

var classes = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrUnavailable, codes.Unavailable},
	{ErrDeadlineExceeded, codes.DeadlineExceeded},
	{ErrCanceled, codes.Canceled},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrUnauthenticated, codes.Unauthenticated},
	{ErrInternal, codes.Internal},
}

// FieldError is an invalid request field.
type FieldError struct {
	Field  string // dotted path, e.g. "resources.memory_bytes"
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrInvalidArgument) true for a FieldError.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidArgument }

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

// WithReason builds a ReasonError.
func WithReason(class error, reason, format string, args ...any) error {
	return &ReasonError{Class: class, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// Code returns the gRPC code of err's class (Unknown when it has none).
func Code(err error) codes.Code {
	switch {
	case err == nil:
		return codes.OK
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Unknown
}

// ToGRPC converts err to a gRPC status error with details: BadRequest for
// field errors, ErrorInfo for reasons. Status errors pass through.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err
	}
	code := Code(err)
	if code == codes.Unknown {
		code = codes.Internal
	}
	st := status.New(code, err.Error())
	var details []protoadapt.MessageV1
	var fe *FieldError
	if errors.As(err, &fe) {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: fe.Field, Description: fe.Reason},
		}})
	}
	var re *ReasonError
	if errors.As(err, &re) && re.Reason != "" {
		details = append(details, &errdetails.ErrorInfo{Domain: Domain, Reason: re.Reason})
	}
	if len(details) > 0 {
		if withDetails, derr := st.WithDetails(details...); derr == nil {
			st = withDetails
		}
	}
	return st.Err()
}

// FromGRPC converts a gRPC status error back into the error classes, keeping
// the status (errors.As to *status.Status still works through GRPCStatus).
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	class := ErrInternal
	for _, c := range classes {
		if c.code == st.Code() {
			class = c.err
			break
		}
	}
	out := &remoteError{status: st, class: class}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			if len(d.GetFieldViolations()) > 0 {
				out.field = d.GetFieldViolations()[0].GetField()
			}
		case *errdetails.ErrorInfo:
			out.reason = d.GetReason()
		}
	}
	return out
}

// remoteError is an error received from controld.
type remoteError struct {
	status *status.Status
	class  error
	field  string
	reason string
}

func (e *remoteError) Error() string { return e.status.Message() }

func (e *remoteError) Unwrap() error { return e.class }

func (e *remoteError) GRPCStatus() *status.Status { return e.status }

// Field returns the request field a remote InvalidArgument named, if any.
func Field(err error) string {
	var re *remoteError
	if errors.As(err, &re) {
		return re.field
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}

// Reason returns the machine-readable reason of err, if any.
func Reason(err error) string {
	var re *remoteError
	if errors.As(err, &re) {
		return re.reason
	}
	var r *ReasonError
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}
