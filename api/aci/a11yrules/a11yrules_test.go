package a11yrules

import (
	"bytes"
	"errors"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

func TestParseRef(t *testing.T) {
	for s, ok := range map[string]bool{
		":1.42:/org/a11y/atspi/accessible/7": true,
		":1.2:/":                             true,
		"org.a11y.Bus:/x":                    false, // a well-known name
		":1.2":                               false,
		":1.2:/a//b":                         false,
		":1.2:/a-b":                          false,
		":1 2:/a":                            false,
	} {
		if _, _, got := ParseRef(s); got != ok {
			t.Errorf("ParseRef(%q) ok %v, want %v", s, got, ok)
		}
	}
}

func TestValidateNamesTheField(t *testing.T) {
	_, err := ValidateTree(&aciv1.A11YTreeRequest{MaxDepth: MaxDepth + 1}, "step.observe_tree")
	if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "step.observe_tree.max_depth" {
		t.Errorf("max_depth: %v (field %q)", err, errdefs.Field(err))
	}
	o, err := ValidateTree(&aciv1.A11YTreeRequest{}, "a11y_tree")
	if err != nil || o.Fields != AllFields || o.MaxNodes != DefaultMaxNodes || o.AppTimeout != DefaultAppTimeout {
		t.Errorf("defaults %+v %v", o, err)
	}
	if err := ValidateAction(&aciv1.A11YActionRequest{Ref: ":1.2:/a", Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_DO}); errdefs.Field(err) != "a11y_action.action" {
		t.Errorf("DO without an action: %v", err)
	}
}

// The hash covers nodes, apps and the flags, and not_modified leaves the
// tree out.
func TestFinish(t *testing.T) {
	tree := func() *aciv1.A11YTreeResponse {
		return &aciv1.A11YTreeResponse{Nodes: []*aciv1.A11YNode{{Role: "desktop frame", Name: "main"}}}
	}
	a, b := tree(), tree()
	b.Partial = true
	Finish(a, nil)
	Finish(b, nil)
	if len(a.TreeHash) != 16 || bytes.Equal(a.TreeHash, b.TreeHash) {
		t.Fatalf("hashes %x %x", a.TreeHash, b.TreeHash)
	}
	c := tree()
	Finish(c, a.TreeHash)
	if !c.NotModified || c.Nodes != nil || !bytes.Equal(c.TreeHash, a.TreeHash) {
		t.Errorf("if_none_match: %v", c)
	}
}
