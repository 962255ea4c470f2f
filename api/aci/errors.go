package aci

import (
	"errors"
	"fmt"

	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Error classes of ACI Error replies. They are the api/errdefs classes where
// one exists, so errors.Is(err, errdefs.ErrNotFound) and
// errors.Is(err, aci.ErrNotFound) are the same test.
var (
	ErrInvalidArgument    = errdefs.ErrInvalidArgument
	ErrNotFound           = errdefs.ErrNotFound
	ErrAlreadyExists      = errdefs.ErrAlreadyExists
	ErrPermissionDenied   = errdefs.ErrPermissionDenied
	ErrTimeout            = errdefs.ErrDeadlineExceeded
	ErrUnavailable        = errdefs.ErrUnavailable
	ErrResourceExhausted  = errdefs.ErrResourceExhausted
	ErrFailedPrecondition = errdefs.ErrFailedPrecondition
	ErrCanceled           = errdefs.ErrCanceled
	ErrInternal           = errdefs.ErrInternal
	// ErrUnimplemented: the server does not know the request kind (an older
	// guestd). It has no errdefs class.
	ErrUnimplemented = errors.New("unimplemented")
)

// Session-level errors.
var (
	// ErrConnectionLost fails calls that were in flight when the connection
	// dropped: the request may or may not have run. It is also an
	// errdefs.ErrUnavailable.
	ErrConnectionLost error = &classedError{msg: "aci: connection lost", class: errdefs.ErrUnavailable}
	// ErrClosed is returned by calls on a session after Close.
	ErrClosed = errors.New("aci: session closed")
	// ErrProtocol reports a peer that broke the ACI framing rules (a reply
	// of the wrong kind, an undecodable frame).
	ErrProtocol = errors.New("aci: protocol violation")
)

type classedError struct {
	msg   string
	class error
}

func (e *classedError) Error() string { return e.msg }
func (e *classedError) Unwrap() error { return e.class }

// Error is an ACI Error reply: the whole request failed on the server.
type Error struct {
	Code    aciv1.ErrorCode
	Message string
	// Field is the request field at fault, as a dotted path, when the server
	// named one.
	Field string
}

func (e *Error) Error() string {
	code := e.Code.String()
	if e.Field != "" {
		return fmt.Sprintf("aci: %s: %s: %s", code, e.Field, e.Message)
	}
	return fmt.Sprintf("aci: %s: %s", code, e.Message)
}

// Unwrap returns the error class of e.Code, which makes errors.Is work
// against the sentinels of this package and of api/errdefs.
func (e *Error) Unwrap() error { return classOf(e.Code) }

func classOf(c aciv1.ErrorCode) error {
	switch c {
	case aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT:
		return ErrInvalidArgument
	case aciv1.ErrorCode_ERROR_CODE_NOT_FOUND:
		return ErrNotFound
	case aciv1.ErrorCode_ERROR_CODE_ALREADY_EXISTS:
		return ErrAlreadyExists
	case aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED:
		return ErrPermissionDenied
	case aciv1.ErrorCode_ERROR_CODE_TIMEOUT:
		return ErrTimeout
	case aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE:
		return ErrUnavailable
	case aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED:
		return ErrResourceExhausted
	case aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION:
		return ErrFailedPrecondition
	case aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED:
		return ErrUnimplemented
	case aciv1.ErrorCode_ERROR_CODE_CANCELED:
		return ErrCanceled
	default:
		// UNSPECIFIED, INTERNAL and codes newer than this client.
		return ErrInternal
	}
}

// FromProto converts an ACI Error message into an *Error (nil for nil).
func FromProto(pe *aciv1.Error) error {
	if pe == nil {
		return nil
	}
	return &Error{Code: pe.GetCode(), Message: pe.GetMessage(), Field: pe.GetField()}
}

// Code returns the ACI error code of err: the Code of an *Error in its chain,
// ERROR_CODE_UNSPECIFIED otherwise.
func Code(err error) aciv1.ErrorCode {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return aciv1.ErrorCode_ERROR_CODE_UNSPECIFIED
}
