package result

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/schemacheck"
)

// schemaPath is the published JSON Schema of forkfleet.bench/v1.
const schemaPath = "../../results/schema.json"

// schemaErrors validates doc against results/schema.json.
func schemaErrors(t *testing.T, doc []byte) []string {
	t.Helper()
	schema, err := os.ReadFile(schemaPath)
	if err != nil {
		t.Fatal(err)
	}
	errs, err := schemacheck.Validate(schema, doc)
	if err != nil {
		t.Fatal(err)
	}
	return errs
}

func sampleResult(t *testing.T) *Result {
	t.Helper()
	now := time.Date(2026, 11, 30, 3, 4, 5, 0, time.UTC)
	small := NewSeries("action.ping", "ms", map[string]string{"transport": "ws"})
	for i := 0; i < 30; i++ {
		small.Add(float64(i) / 10)
	}
	small.Fail()
	small.Warmup()
	big := NewSeries("peer.xdotool.move", "ms", nil)
	big.Baseline = true
	for i := 0; i < 150; i++ {
		big.Add(5 + float64(i%7))
	}
	empty := NewSeries("action.click", "ms", nil)
	empty.Fail()
	return &Result{
		Schema: SchemaID, Suite: "action", Status: StatusOK,
		StartedAt: now, FinishedAt: now.Add(time.Minute),
		Host:   Host{Hostname: "h", CPUModel: "x", Cores: 2, MHz: 2400, HostEnv: map[string]string{}},
		Build:  Build{Commit: "none", GoVersion: "go1.26"},
		Config: map[string]any{"n": 30},
		Rows:   []Row{small.Row(), big.Row(), empty.Row()},
	}
}

func TestWrittenResultMatchesSchemaAndTypes(t *testing.T) {
	root := t.TempDir()
	r := sampleResult(t)
	loc, err := Reserve(root, r.Suite, r.StartedAt)
	if err != nil {
		t.Fatal(err)
	}
	path, err := Write(loc, r)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "2026-11-30", "action-030405.json"); path != want {
		t.Fatalf("path %s, want %s", path, want)
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if errs := schemaErrors(t, doc); len(errs) > 0 {
		t.Fatalf("schema violations:\n%s", strings.Join(errs, "\n"))
	}
	back, err := Decode(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	if back.Rows[1].P99 == nil || back.Rows[0].P99 != nil || back.Rows[2].P50 != nil {
		t.Fatalf("p99/empty-row rules not kept: %+v", back.Rows)
	}
	if back.Rows[0].Failed != 1 || back.Rows[0].Warmup != 1 || back.Rows[0].N != 30 {
		t.Fatalf("counts lost: %+v", back.Rows[0])
	}
}

func TestSchemaRejectsBrokenRows(t *testing.T) {
	r := sampleResult(t)
	good, _ := json.Marshal(r)
	if errs := schemaErrors(t, good); len(errs) > 0 {
		t.Fatalf("good doc rejected: %v", errs)
	}
	cases := map[string]func(m map[string]any){
		"p99 below 100": func(m map[string]any) { row(m, 0)["p99"] = 1.0 },
		"no p99 at 150": func(m map[string]any) { delete(row(m, 1), "p99") },
		"stats at n=0":  func(m map[string]any) { row(m, 2)["p50"] = 1.0 },
		"extra field":   func(m map[string]any) { row(m, 0)["latency"] = 1.0 },
		"bad schema":    func(m map[string]any) { m["schema"] = "forkfleet.bench/v2" },
		"no host":       func(m map[string]any) { delete(m, "host") },
		"bad status":    func(m map[string]any) { m["status"] = "meh" },
	}
	for name, mutate := range cases {
		var m map[string]any
		_ = json.Unmarshal(good, &m)
		mutate(m)
		doc, _ := json.Marshal(m)
		if errs := schemaErrors(t, doc); len(errs) == 0 {
			t.Errorf("%s: schema accepted it", name)
		}
		if _, err := Decode(bytes.NewReader(doc)); err == nil {
			t.Errorf("%s: Go validation accepted it", name)
		}
	}
}

func row(m map[string]any, i int) map[string]any {
	return m["rows"].([]any)[i].(map[string]any)
}

func TestNeverOverwrite(t *testing.T) {
	root := t.TempDir()
	r := sampleResult(t)
	var paths []string
	for i := 0; i < 3; i++ {
		loc, err := Reserve(root, r.Suite, r.StartedAt)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Write(loc, r)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	if paths[0] == paths[1] || paths[1] == paths[2] {
		t.Fatalf("names reused: %v", paths)
	}
	// A second Write to the same Location adds a suffix rather than replacing.
	loc := Location{Dir: filepath.Dir(paths[0]), Base: "action-030405"}
	before, _ := os.ReadFile(paths[0])
	r2 := sampleResult(t)
	r2.Config["n"] = 99
	p, err := Write(loc, r2)
	if err != nil {
		t.Fatal(err)
	}
	if p == paths[0] {
		t.Fatal("overwrote existing result")
	}
	after, _ := os.ReadFile(paths[0])
	if !bytes.Equal(before, after) {
		t.Fatal("existing result modified")
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Fatalf("temporary file left: %s", e.Name())
		}
	}
}

func TestWriteRefusesInvalid(t *testing.T) {
	r := sampleResult(t)
	r.Rows[0].Labels = nil
	loc, _ := Reserve(t.TempDir(), "action", r.StartedAt)
	if _, err := Write(loc, r); err == nil {
		t.Fatal("invalid result written")
	}
}

func TestDirection(t *testing.T) {
	for unit, want := range map[string]string{"ms": BetterLower, "bytes": BetterLower, "percent": BetterLower,
		"frames/s": BetterHigher, "MB": BetterLower, "steps/s": BetterHigher} {
		if got := (Row{Unit: unit}).Direction(); got != want {
			t.Errorf("%s: %s", unit, got)
		}
	}
	if (Row{Unit: "percent", Better: BetterHigher}).Direction() != BetterHigher {
		t.Error("override ignored")
	}
}
