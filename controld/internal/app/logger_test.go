package app_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/config"
)

func TestLoggerLevelAndFormat(t *testing.T) {
	var b bytes.Buffer
	log, err := app.NewLogger(config.Log{Level: "warn", Format: "json"}, &b)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("dropped")
	log.Warn("kept", "sandbox", "sb-1")
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %q: %v", b.String(), err)
	}
	if rec["level"] != "WARN" || rec["msg"] != "kept" || rec["sandbox"] != "sb-1" {
		t.Fatalf("record %v", rec)
	}
	b.Reset()
	log, _ = app.NewLogger(config.Log{Level: "debug", Format: "text"}, &b)
	log.Debug("verbose", "k", "v")
	if !strings.Contains(b.String(), "level=DEBUG msg=verbose k=v") {
		t.Fatalf("text record %q", b.String())
	}
	if _, err := app.NewLogger(config.Log{Level: "loud", Format: "text"}, &b); err == nil {
		t.Fatal("bad level accepted")
	}
}
