package aci

import (
	"errors"
	"strings"
	"testing"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

func sampleTree() *aciv1.A11YTreeResponse {
	v := 0.5
	return &aciv1.A11YTreeResponse{
		Apps: []*aciv1.A11YApp{{Name: "Chromium", Node: 1}},
		Nodes: []*aciv1.A11YNode{
			{Id: 0, Role: "desktop frame", Name: "main", Children: []uint32{1}},
			{Id: 1, Role: "application", Name: "Chromium", App: 1, Children: []uint32{2}},
			{Id: 2, Role: "frame", Name: "Page", App: 1, Window: 2, Children: []uint32{3, 4, 5, 6},
				Bounds: &aciv1.Rect{Width: 1280, Height: 800}},
			{Id: 3, Role: "panel", App: 1, Window: 2},
			{Id: 4, Role: "push button", Name: "Save", App: 1, Window: 2, Actions: []string{"press"},
				States: 1<<StateFocused | 1<<StateEnabled | 1<<StateSensitive | 1<<StateShowing,
				Bounds: &aciv1.Rect{X: 10, Y: 20, Width: 100, Height: 30}},
			{Id: 5, Role: "entry", Name: "Name", App: 1, Window: 2, Text: "Ada", States: 1 << StateEnabled, Actions: []string{"activate"}},
			{Id: 6, Role: "slider", App: 1, Window: 2, Value: &v},
		},
	}
}

func TestRenderTree(t *testing.T) {
	got := RenderTree(sampleTree(), RenderOptions{})
	want := `[0] desktop frame "main"
  [1] application "Chromium"
    [2] frame "Page" @0,0 1280x800
      [4] push button "Save" @10,20 100x30 focused
      [5] entry "Name" text="Ada"
      [6] slider value=0.5
`
	if got != want {
		t.Errorf("render:\n%s\nwant:\n%s", got, want)
	}
	if all := RenderTree(sampleTree(), RenderOptions{All: true}); !strings.Contains(all, "[3] panel") {
		t.Errorf("All left the unnamed panel out:\n%s", all)
	}
	long := sampleTree()
	long.Nodes[4].Name = strings.Repeat("é", 100)
	if r := RenderTree(long, RenderOptions{MaxLineBytes: 11}); !strings.Contains(r, `"ééééé…"`) {
		t.Errorf("long name not cut at a rune: %s", r)
	}
	if s := States(sampleTree().Nodes[4]); strings.Join(s, ",") != "enabled,focused,sensitive,showing" {
		t.Errorf("states %v", s)
	}
}

func TestCheckTreeRefusesHostileIDs(t *testing.T) {
	if err := checkTree(sampleTree()); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*aciv1.A11YTreeResponse){
		"id not its index":   func(r *aciv1.A11YTreeResponse) { r.Nodes[3].Id = 9 },
		"child loops back":   func(r *aciv1.A11YTreeResponse) { r.Nodes[2].Children = append(r.Nodes[2].Children, 1) },
		"child out of range": func(r *aciv1.A11YTreeResponse) { r.Nodes[2].Children = append(r.Nodes[2].Children, 99) },
		"unknown app":        func(r *aciv1.A11YTreeResponse) { r.Nodes[3].App = 7 },
	} {
		r := sampleTree()
		mutate(r)
		if err := checkTree(r); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
}
