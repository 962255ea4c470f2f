package aci_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// The fake guestd answers a11y requests by guestd's rules (a11yrules):
// the same validation, roots, limits, fields and tree hash.
func TestFakeA11y(t *testing.T) {
	srv := startServer(t, nil)
	s := dial(t, srv)
	ctx := ctxT(t)
	var ae *aci.Error
	full, err := s.A11yTree(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(full.Nodes) != 7 || full.Nodes[3].Name != "OK" || full.Nodes[3].Bounds == nil || len(full.TreeHash) != 16 {
		t.Fatalf("desktop tree:\n%s", aci.RenderTree(full, aci.RenderOptions{All: true}))
	}
	same, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{IfNoneMatch: full.TreeHash})
	if err != nil || !same.NotModified || len(same.Nodes) != 0 || !bytes.Equal(same.TreeHash, full.TreeHash) {
		t.Fatalf("if_none_match: %v %v", same, err)
	}
	if r, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{ShowingOnly: true}); err != nil || len(r.Nodes) != 6 {
		t.Errorf("showing only: %d nodes, %v", len(r.GetNodes()), err)
	}
	if r, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{MaxNodes: 3}); err != nil || len(r.Nodes) != 3 || !r.Truncated || !r.Nodes[2].ChildrenTruncated {
		t.Errorf("max_nodes 3: %v %v", r, err)
	}
	if r, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{Fields: []aciv1.A11YField{aciv1.A11YField_A11Y_FIELD_STATES}}); err != nil || r.Nodes[3].Bounds != nil || r.Nodes[3].States == 0 || len(r.Nodes[3].Actions) != 0 {
		t.Errorf("states only: %v %v", r.GetNodes(), err)
	}
	if _, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{MaxNodes: 20001}); !errors.As(err, &ae) || ae.Field != "a11y_tree.max_nodes" || !errors.Is(err, aci.ErrInvalidArgument) {
		t.Errorf("max_nodes past the bound: %v", err)
	}
	win, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW})
	if err != nil || win.Nodes[0].Role != "frame" || len(win.Nodes) != 5 || win.Apps[0].Node != 0 {
		t.Errorf("focused window: %v %v", win, err)
	}
	at, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_POINT, Point: &aciv1.Point{X: 30, Y: 65}})
	if err != nil || at.Nodes[0].Name != "Name" {
		t.Errorf("point on the entry: %v %v", at, err)
	}
	// Actions change the tree; errors are guestd's.
	entry := full.Nodes[4].Ref
	if err := s.A11yAction(ctx, aci.SetText(entry, "Ada")); err != nil {
		t.Fatal(err)
	}
	st, err := s.StepRequest(ctx, &aciv1.StepRequest{ObserveTree: &aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW}})
	if err != nil || st.Tree == nil || st.Tree.Nodes[2].Text != "Ada" {
		t.Errorf("step.observe_tree after set_text: %v %v", st, err)
	}
	if err := s.A11yAction(ctx, aci.SetText(full.Nodes[3].Ref, "x")); !errors.Is(err, aci.ErrFailedPrecondition) {
		t.Errorf("set_text on a button: %v", err)
	}
	if err := s.A11yAction(ctx, aci.DoAction(full.Nodes[3].Ref, "press")); err != nil {
		t.Errorf("press: %v", err)
	}
	if err := s.A11yAction(ctx, aci.DoAction(":1.2:/no/such", "press")); !errors.Is(err, aci.ErrNotFound) {
		t.Errorf("gone element: %v", err)
	}
	if err := s.A11yAction(ctx, aci.DoAction("org.a11y:/x", "press")); !errors.Is(err, aci.ErrInvalidArgument) {
		t.Errorf("well-known bus name: %v", err)
	}
}
