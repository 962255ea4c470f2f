package errgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
)

func TestRoundTrip(t *testing.T) {
	for _, class := range []error{
		errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition,
		errdefs.ErrResourceExhausted, errdefs.ErrUnavailable, errdefs.ErrDeadlineExceeded, errdefs.ErrCanceled,
		errdefs.ErrPermissionDenied, errdefs.ErrUnauthenticated, errdefs.ErrInternal,
	} {
		wire := errgrpc.ToGRPC(fmt.Errorf("thing: %w", class))
		if _, ok := status.FromError(wire); !ok {
			t.Fatalf("%v: not a status error", class)
		}
		back := errgrpc.FromGRPC(wire)
		if !errors.Is(back, class) {
			t.Errorf("%v: round trip lost the class: %v", class, back)
		}
		if back.Error() != "thing: "+class.Error() {
			t.Errorf("message = %q", back.Error())
		}
		if s, ok := status.FromError(back); !ok || s.Code() != errgrpc.Code(class) {
			t.Errorf("%v: status not kept", class)
		}
	}
}

func TestFieldAndReason(t *testing.T) {
	err := errgrpc.FromGRPC(errgrpc.ToGRPC(errdefs.InvalidField("screen.width", "must be 64..16384, got %d", 10)))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "screen.width" {
		t.Errorf("field error = %v, field %q", err, errdefs.Field(err))
	}
	err = errgrpc.FromGRPC(errgrpc.ToGRPC(errdefs.WithReason(errdefs.ErrNotFound, "SANDBOX_NOT_FOUND", "sandbox %q not found", "sb-1")))
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Reason(err) != "SANDBOX_NOT_FOUND" {
		t.Errorf("reason error = %v, reason %q", err, errdefs.Reason(err))
	}
	local := errdefs.WithReason(errdefs.ErrFailedPrecondition, "X", "m")
	if errdefs.Reason(local) != "X" || errdefs.Field(local) != "" {
		t.Error("local reason")
	}
}

func TestCodes(t *testing.T) {
	cases := map[error]codes.Code{
		nil:                              codes.OK,
		context.Canceled:                 codes.Canceled,
		context.DeadlineExceeded:         codes.DeadlineExceeded,
		errors.New("plain"):              codes.Unknown,
		status.Error(codes.Aborted, "x"): codes.Aborted,
	}
	for err, want := range cases {
		if got := errgrpc.Code(err); got != want {
			t.Errorf("Code(%v) = %v, want %v", err, got, want)
		}
	}
	// An unclassified error goes out as Internal.
	if s, _ := status.FromError(errgrpc.ToGRPC(errors.New("boom"))); s.Code() != codes.Internal {
		t.Errorf("plain error -> %v", s.Code())
	}
	// Unknown codes come back as ErrInternal; non-status errors pass.
	if err := errgrpc.FromGRPC(status.Error(codes.Aborted, "x")); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("aborted -> %v", err)
	}
	plain := errors.New("plain")
	if errgrpc.FromGRPC(plain) != plain || errgrpc.FromGRPC(nil) != nil || errgrpc.ToGRPC(nil) != nil {
		t.Error("pass-through")
	}
}
