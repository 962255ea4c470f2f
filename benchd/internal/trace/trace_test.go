package trace

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLocalJSONLines(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	p := filepath.Join(t.TempDir(), "x.trace.jsonl")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), "action", p)
	if err != nil {
		t.Fatal(err)
	}
	_, sp := Tracer().Start(context.Background(), "step")
	sp.End()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(p)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var span struct{ Name string }
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &span) != nil || span.Name != "step" {
		t.Fatalf("span file: %q", data)
	}
}

func TestBadProtocol(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	if _, err := Start(context.Background(), "x", ""); err == nil {
		t.Fatal("unknown protocol accepted")
	}
}
