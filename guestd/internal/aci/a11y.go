package aci

import (
	"context"
	"errors"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/a11y"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// a11yTree answers an a11y_tree request (or a step's observe_tree; field
// names which). The tree's application calls are bounded by the request's
// timeouts; roots that name a window need the display.
func (s *Server) a11yTree(ctx context.Context, r *aciv1.A11YTreeRequest, field string) (*aciv1.A11YTreeResponse, error) {
	opts, err := a11y.ValidateTree(r, field)
	if err != nil {
		return nil, err
	}
	windows := func() ([]desktop.Window, error) {
		d, err := s.desktop()
		if err != nil {
			return nil, err
		}
		return d.ListWindows()
	}
	resp, err := s.opts.A11y.Tree(ctx, opts, windows)
	switch {
	case err == nil:
		return resp, nil
	case errors.Is(err, a11y.ErrNoBus):
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_TIMEOUT, "", "the tree took longer than %v", opts.Timeout)
	}
	return nil, err
}
