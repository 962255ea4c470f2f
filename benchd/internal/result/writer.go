package result

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Location names where one run's files go: <root>/<YYYY-MM-DD>/<suite>-<HHMMSS>.
type Location struct {
	Dir  string
	Base string // file name without extension
}

// JSONPath is the result file.
func (l Location) JSONPath() string { return filepath.Join(l.Dir, l.Base+".json") }

// TracePath is the local span file written next to the result.
func (l Location) TracePath() string { return filepath.Join(l.Dir, l.Base+".trace.jsonl") }

// Reserve picks a Location under root for a run of suite started at t and
// claims it by creating the trace file exclusively: two runs in the same
// second get different names instead of sharing one. The reserved trace file
// is left empty when tracing goes elsewhere.
func Reserve(root, suite string, t time.Time) (Location, error) {
	t = t.UTC()
	dir := filepath.Join(root, t.Format("2006-01-02"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Location{}, fmt.Errorf("create results dir: %w", err)
	}
	stem := fmt.Sprintf("%s-%s", suite, t.Format("150405"))
	for i := 0; i < 1000; i++ {
		base := stem
		if i > 0 {
			base = fmt.Sprintf("%s-%d", stem, i)
		}
		loc := Location{Dir: dir, Base: base}
		if _, err := os.Lstat(loc.JSONPath()); err == nil {
			continue
		}
		f, err := os.OpenFile(loc.TracePath(), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return Location{}, fmt.Errorf("reserve %s: %w", loc.TracePath(), err)
		}
		f.Close()
		return loc, nil
	}
	return Location{}, fmt.Errorf("no free result name for %s in %s", stem, dir)
}

// Write validates r and publishes it at loc.JSONPath() without ever replacing
// an existing file: the document is written to a temporary file and hard
// linked into place (link fails on an existing name), so readers never see a
// partial file either. When the name is taken a numeric suffix is added. It
// returns the path written.
func Write(loc Location, r *Result) (string, error) { return write(loc, r, true) }

// WriteCompact is Write with the document on one line, as result files are
// committed (a pooled A/B result holds thousands of raw samples).
func WriteCompact(loc Location, r *Result) (string, error) { return write(loc, r, false) }

func write(loc Location, r *Result, indent bool) (string, error) {
	if err := r.Validate(); err != nil {
		return "", fmt.Errorf("refusing to write invalid result: %w", err)
	}
	var data []byte
	var err error
	if indent {
		data, err = json.MarshalIndent(r, "", "  ")
	} else {
		data, err = json.Marshal(r)
	}
	if err != nil {
		return "", fmt.Errorf("encode result: %w", err)
	}
	data = append(data, '\n')
	tmp, err := os.CreateTemp(loc.Dir, ".tmp-"+loc.Base+"-*")
	if err != nil {
		return "", fmt.Errorf("write result: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write result: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("sync result: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("close result: %w", err)
	}
	for i := 0; i < 1000; i++ {
		name := loc.JSONPath()
		if i > 0 {
			name = filepath.Join(loc.Dir, fmt.Sprintf("%s-%d.json", loc.Base, i))
		}
		err := os.Link(tmp.Name(), name)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("publish result: %w", err)
		}
	}
	return "", fmt.Errorf("no free name for %s", loc.JSONPath())
}
