package fleet_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
)

// maxManagerMethods bounds the methods declared on Manager, a facade over
// the concerns it embeds: Close, telemetry, reconciliation at start and
// the few RPCs that delegate (watch, export, import, verify). A method
// belongs on its concern's type (doc.go), not on Manager.
const maxManagerMethods = 11

// concern is one type the fleet is split into: the other concern types it
// may hold (besides the registry, which every concern embeds) and the files
// its methods live in (doc.go's map).
type concern struct {
	holds []string
	files []string
}

// concerns is the split: a concern reaches another only through a field
// listed here, so the coupling between concerns stays visible in one
// table, and its methods stay in its files, so doc.go stays true.
var concerns = map[string]concern{
	"registry": {files: []string{"manager.go", "watch.go", "checkpoint_tree.go"}},
	"sandboxer": {holds: []string{"warmer", "pooler"},
		files: []string{"sandbox.go", "manager.go", "boot.go", "exits.go", "limits.go", "network.go", "view.go", "recording.go"}},
	"warmer": {holds: []string{"warmSlots", "sandboxer"}, files: []string{"warmslots.go", "forkslots.go"}},
	"pooler": {holds: []string{"sandboxer", "checkpointer", "forker"},
		files: []string{"pool.go", "pool_claim.go", "pool_session.go", "pool_checkpoint.go"}},
	"checkpointer": {holds: []string{"warmer", "pooler"}, files: []string{"checkpoint.go", "checkpoint_tree.go"}},
	"forker":       {holds: []string{"verifier", "transfer", "sandboxer", "warmer"}, files: []string{"fork.go"}},
	"verifier":     {files: []string{"verify.go"}},
	"transfer":     {holds: []string{"checkpointer"}, files: []string{"checkpoint_transfer.go", "checkpoint_registry.go"}},
	"warmSlots":    {holds: []string{"warmer", "forkSlots"}, files: []string{"warmslots.go"}},
	"forkSlots":    {holds: []string{"warmer", "warmSlots"}, files: []string{"forkslots.go"}},
}

// stillOnManager are the types that hold the whole *Manager: its metrics
// collector and a restart's adoption of what it finds (reconcile.go), both
// of which read every concern. No concern does.
var stillOnManager = []string{"collector", "adoption"}

// TestConcernsSplit pins the fleet's split by concern: Manager's method
// count stays under its bound, a concern type reaches the others only
// through the fields the table above lists (the registry holds none), its
// methods stay in its files, and only the types listed hold the whole
// *Manager.
func TestConcernsSplit(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]int{}     // receiver type -> methods declared on it
	where := map[string][]string{}  // receiver type -> the files declaring them
	fields := map[string][]string{} // struct type -> the named types of its fields
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && len(d.Recv.List) == 1 {
					recv := typeName(d.Recv.List[0].Type)
					methods[recv]++
					if !slices.Contains(where[recv], name) {
						where[recv] = append(where[recv], name)
					}
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, fl := range st.Fields.List {
						fields[ts.Name.Name] = append(fields[ts.Name.Name], typeName(fl.Type))
					}
				}
			}
		}
	}

	if n := methods["Manager"]; n > maxManagerMethods {
		t.Errorf("Manager has %d methods, more than %d: put the new ones on their concern's type (doc.go)", n, maxManagerMethods)
	}
	for c, want := range concerns {
		if _, ok := fields[c]; !ok {
			t.Errorf("concern type %s is gone: update the table", c)
			continue
		}
		for _, ft := range fields[c] {
			if _, isConcern := concerns[ft]; isConcern && ft != "registry" && ft != c && !slices.Contains(want.holds, ft) {
				t.Errorf("%s holds a %s, which the concerns table does not list", c, ft)
			}
		}
		for _, f := range where[c] {
			if !slices.Contains(want.files, f) {
				t.Errorf("%s has methods in %s, not one of its files %v: put them there (or move the concern, and doc.go with it)", c, f, want.files)
			}
		}
	}
	var reaching []string
	for typ, fts := range fields {
		if slices.Contains(fts, "Manager") {
			reaching = append(reaching, typ)
		}
	}
	sort.Strings(reaching)
	for _, typ := range reaching {
		if !slices.Contains(stillOnManager, typ) {
			t.Errorf("%s holds a *Manager: give it the registry (and the concerns it needs) instead", typ)
		}
	}
	for _, typ := range stillOnManager {
		if !slices.Contains(reaching, typ) {
			t.Errorf("%s no longer holds a *Manager: take it off stillOnManager", typ)
		}
	}
	names := []string{"Manager"}
	for c := range concerns {
		names = append(names, c)
	}
	sort.Strings(names[1:])
	for _, n := range names {
		t.Logf("%s: %d methods", n, methods[n])
	}
}

// typeName is the name of a (pointer to a) named type, "" for others.
func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.Ident:
		return e.Name
	case *ast.IndexExpr: // generic receiver
		return typeName(e.X)
	}
	return ""
}
