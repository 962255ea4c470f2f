// Package result defines the forkfleet.bench/v1 result file: one JSON
// document per suite run, self-describing enough to be compared and rendered
// without re-running anything.
package result

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"
)

// SchemaID names the format; readers refuse anything else.
const SchemaID = "forkfleet.bench/v1"

// Status of a suite run.
const (
	StatusOK      = "ok"
	StatusFailed  = "failed"
	StatusSkipped = "skipped"
)

// Better is the direction in which a metric improves.
const (
	BetterLower  = "lower"
	BetterHigher = "higher"
)

// Result is one suite run.
type Result struct {
	Schema     string         `json:"schema"`
	Suite      string         `json:"suite"`
	Status     string         `json:"status"`
	Reason     string         `json:"reason,omitempty"` // skip reason or failure message
	StartedAt  time.Time      `json:"started_at"`
	FinishedAt time.Time      `json:"finished_at"`
	Host       Host           `json:"host"`
	Build      Build          `json:"build"`
	Config     map[string]any `json:"config"`
	Rows       []Row          `json:"rows"`
	// Notes record what the run could not measure and why (a sub-shape
	// skipped, a peer missing), so an absent row is never silent.
	Notes []string `json:"notes,omitempty"`
}

// Host fingerprints the machine a result was measured on.
type Host struct {
	Hostname          string            `json:"hostname"`
	CPUModel          string            `json:"cpu_model"`
	Cores             int               `json:"cores"`
	MHz               float64           `json:"mhz"`
	MemoryBytes       uint64            `json:"memory_bytes"`
	Kernel            string            `json:"kernel"`
	DebianVersion     string            `json:"debian_version"`
	ContainerdVersion string            `json:"containerd_version"`
	RuncVersion       string            `json:"runc_version"`
	CRIUVersion       string            `json:"criu_version"`
	HostEnv           map[string]string `json:"host_env"`
	LoadBefore        [3]float64        `json:"load_before"`
	LoadAfter         [3]float64        `json:"load_after"`
	// Hypervisor is what the kernel detected at boot (KVM, PVM...), empty
	// on bare metal or when the boot log could not be read.
	Hypervisor string `json:"hypervisor,omitempty"`
	// PageTouchNs is the host's price of a first write to a fresh 4 KiB page
	// of anonymous memory, per page (hostinfo.PageTouchNs): the unit of a
	// restore's page copy and of every copy-on-write fault, and what sets
	// hosts with the same CPU model but another hypervisor apart.
	PageTouchNs float64 `json:"page_touch_ns,omitempty"`
}

// Build identifies the code that was measured.
type Build struct {
	Commit           string `json:"commit"`
	Dirty            bool   `json:"dirty"`
	GoVersion        string `json:"go_version"`
	ExecutableSHA256 string `json:"executable_sha256"`
}

// Row is one measured distribution. Latency-like fields are absent when no
// sample succeeded (N == 0); P99 is present exactly when N >= 100.
type Row struct {
	Metric     string            `json:"metric"`
	Unit       string            `json:"unit"`
	N          int               `json:"n"`
	P50        *float64          `json:"p50,omitempty"`
	P90        *float64          `json:"p90,omitempty"`
	P99        *float64          `json:"p99,omitempty"`
	Min        *float64          `json:"min,omitempty"`
	Max        *float64          `json:"max,omitempty"`
	Mean       *float64          `json:"mean,omitempty"`
	Baseline   bool              `json:"baseline"`
	Labels     map[string]string `json:"labels"`
	Failed     int               `json:"failed"`
	Unverified int               `json:"unverified"`
	Warmup     int               `json:"warmup"`
	// Better overrides the unit's default direction (e.g. a hit rate in
	// percent improves upward while CPU percent improves downward).
	Better string `json:"better,omitempty"`
	// Samples are the raw successful values, in measurement order.
	Samples []float64 `json:"samples,omitempty"`
}

// Key identifies a row across runs: metric plus sorted labels.
func (r Row) Key() string {
	keys := make([]string, 0, len(r.Labels))
	for k := range r.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(r.Metric)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, r.Labels[k])
	}
	return b.String()
}

// Direction returns BetterLower or BetterHigher for the row.
func (r Row) Direction() string {
	if r.Better != "" {
		return r.Better
	}
	return UnitDirection(r.Unit)
}

// higherUnits improve upward; every other unit (time, size, CPU) downward.
var higherUnits = map[string]bool{
	"frames/s": true, "frames/s/GHz-core": true, "ops/s": true, "steps/s": true,
	"Mbps": true, "MB/s": true, "x": true, "hit-rate": true,
}

// UnitDirection is the default improvement direction of a unit.
func UnitDirection(unit string) string {
	if higherUnits[unit] || strings.HasSuffix(unit, "/s") {
		return BetterHigher
	}
	return BetterLower
}

// Validate checks the invariants the schema states and readers rely on.
func (r *Result) Validate() error {
	var errs []error
	if r.Schema != SchemaID {
		errs = append(errs, fmt.Errorf("schema %q, want %q", r.Schema, SchemaID))
	}
	if r.Suite == "" {
		errs = append(errs, errors.New("suite is empty"))
	}
	switch r.Status {
	case StatusOK:
	case StatusFailed, StatusSkipped:
		if r.Reason == "" {
			errs = append(errs, fmt.Errorf("status %s without reason", r.Status))
		}
	default:
		errs = append(errs, fmt.Errorf("status %q unknown", r.Status))
	}
	if r.StartedAt.IsZero() || r.FinishedAt.Before(r.StartedAt) {
		errs = append(errs, errors.New("started_at/finished_at missing or reversed"))
	}
	if r.Host.Cores < 1 || r.Host.HostEnv == nil {
		errs = append(errs, errors.New("host fingerprint missing (cores < 1 or host_env null)"))
	}
	if r.Config == nil {
		errs = append(errs, errors.New("config is null"))
	}
	seen := map[string]bool{}
	for i, row := range r.Rows {
		if err := row.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("rows[%d] (%s): %w", i, row.Metric, err))
		}
		k := row.Key()
		if row.Baseline {
			k += " [baseline]"
		}
		if seen[k] {
			errs = append(errs, fmt.Errorf("rows[%d]: duplicate row %q", i, k))
		}
		seen[k] = true
	}
	return errors.Join(errs...)
}

// Validate checks one row.
func (row Row) Validate() error {
	if row.Metric == "" || row.Unit == "" {
		return errors.New("metric and unit are required")
	}
	if row.Labels == nil {
		return errors.New("labels is null (use {})")
	}
	if row.N < 0 || row.Failed < 0 || row.Unverified < 0 || row.Warmup < 0 {
		return errors.New("negative count")
	}
	if row.Better != "" && row.Better != BetterLower && row.Better != BetterHigher {
		return fmt.Errorf("better %q", row.Better)
	}
	stat := []*float64{row.P50, row.P90, row.Min, row.Max, row.Mean}
	if row.N == 0 {
		for _, p := range append(stat, row.P99) {
			if p != nil {
				return errors.New("statistics present with n=0")
			}
		}
		return nil
	}
	for _, p := range stat {
		if p == nil {
			return errors.New("p50/p90/min/max/mean required when n>0")
		}
		if math.IsNaN(*p) || math.IsInf(*p, 0) {
			return errors.New("non-finite statistic")
		}
	}
	if (row.N >= 100) != (row.P99 != nil) {
		return fmt.Errorf("p99 must be present exactly when n>=100 (n=%d)", row.N)
	}
	if *row.Min > *row.P50 || *row.P50 > *row.P90 || *row.P90 > *row.Max {
		return errors.New("min <= p50 <= p90 <= max violated")
	}
	if row.P99 != nil && (*row.P99 < *row.P90 || *row.P99 > *row.Max) {
		return errors.New("p90 <= p99 <= max violated")
	}
	if row.Samples != nil && len(row.Samples) != row.N {
		return fmt.Errorf("%d samples for n=%d", len(row.Samples), row.N)
	}
	return nil
}

// Decode reads and validates a result.
func Decode(rd io.Reader) (*Result, error) {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	var r Result
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("decode result: %w", err)
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("invalid result: %w", err)
	}
	return &r, nil
}

// ReadFile decodes the result at path.
func ReadFile(path string) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := Decode(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
