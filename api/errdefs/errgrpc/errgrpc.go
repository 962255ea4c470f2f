// Package errgrpc converts forkfleet's error classes (package errdefs) to and
// from gRPC status: once at the server boundary, once in the client.
package errgrpc

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

var classes = []struct {
	err  error
	code codes.Code
}{
	{errdefs.ErrInvalidArgument, codes.InvalidArgument},
	{errdefs.ErrNotFound, codes.NotFound},
	{errdefs.ErrAlreadyExists, codes.AlreadyExists},
	{errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
	{errdefs.ErrResourceExhausted, codes.ResourceExhausted},
	{errdefs.ErrUnavailable, codes.Unavailable},
	{errdefs.ErrDeadlineExceeded, codes.DeadlineExceeded},
	{errdefs.ErrCanceled, codes.Canceled},
	{errdefs.ErrPermissionDenied, codes.PermissionDenied},
	{errdefs.ErrUnauthenticated, codes.Unauthenticated},
	{errdefs.ErrInternal, codes.Internal},
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
	var fe *errdefs.FieldError
	if errors.As(err, &fe) {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: fe.Field, Description: fe.Reason},
		}})
	}
	if reason := errdefs.Reason(err); reason != "" {
		details = append(details, &errdetails.ErrorInfo{Domain: errdefs.Domain, Reason: reason})
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
	class := errdefs.ErrInternal
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

// remoteError is an error received from controld; errdefs.Field and
// errdefs.Reason read what it carried.
type remoteError struct {
	status *status.Status
	class  error
	field  string
	reason string
}

func (e *remoteError) Error() string { return e.status.Message() }

func (e *remoteError) Unwrap() error { return e.class }

func (e *remoteError) GRPCStatus() *status.Status { return e.status }

func (e *remoteError) ErrorField() string { return e.field }

func (e *remoteError) ErrorReason() string { return e.reason }
