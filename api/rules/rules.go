// Package rules holds the rules of controld's requests that controld and its
// in-memory fake (api/controldfake) share, so the fake refuses what controld
// refuses with the same error: field validation, id syntax, request ids
// (idempotency, Dedup) and pagination (Page). Resource limits and network
// policies have their own packages (api/limits, api/netpolicy).
package rules

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/screen"
)

// Limits of request fields.
const (
	MaxLabels      = 64
	MaxLabelKey    = 63
	MaxLabelValue  = 256
	MaxEnv         = 128
	MaxEnvValue    = 32 << 10
	MaxImageRef    = 512
	MaxName        = 128
	MaxTTL         = 30 * 24 * time.Hour
	MaxWaitTimeout = time.Hour
	MaxForkCount   = 64
	MaxPoolSize    = 64
)

// PoolIDLabel is the label a claimed sandbox carries naming its pool.
const PoolIDLabel = "pool_id"

// ReservedEnvPrefix is the runtime's own namespace in a sandbox's
// environment (tokens, geometry); requests may not set it.
const ReservedEnvPrefix = "FORKFLEET_"

// Image checks an image reference (empty: the default image).
func Image(field, ref string) error {
	switch {
	case len(ref) > MaxImageRef:
		return errdefs.InvalidField(field, "longer than %d bytes", MaxImageRef)
	case strings.ContainsAny(ref, " \t\r\n"):
		return errdefs.InvalidField(field, "contains whitespace")
	case ref != "" && !utf8.ValidString(ref):
		return errdefs.InvalidField(field, "not valid UTF-8")
	}
	return nil
}

// Screen checks an optional screen geometry (package screen's bounds).
func Screen(field string, s *controldv1.Screen) error {
	if s == nil {
		return nil
	}
	if w := s.GetWidth(); !screen.EdgeOK(int(w)) {
		return errdefs.InvalidField(field+".width", "%d out of range %d..%d", w, screen.MinEdge, screen.MaxEdge)
	}
	if h := s.GetHeight(); !screen.EdgeOK(int(h)) {
		return errdefs.InvalidField(field+".height", "%d out of range %d..%d", h, screen.MinEdge, screen.MaxEdge)
	}
	if d := s.GetDepth(); !screen.DepthOK(int(d)) {
		return errdefs.InvalidField(field+".depth", "%d: must be %d (0 means %d)", d, screen.Depth, screen.Depth)
	}
	return nil
}

func labelKeyOK(k string) bool {
	if k == "" || len(k) > MaxLabelKey {
		return false
	}
	for _, c := range k {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-', c == '/':
		default:
			return false
		}
	}
	return true
}

// Labels checks labels: keys 1..MaxLabelKey of [A-Za-z0-9._/-], values
// valid UTF-8 of at most MaxLabelValue bytes, at most MaxLabels of them.
func Labels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return errdefs.InvalidField(field, "%d labels, at most %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if !labelKeyOK(k) {
			return errdefs.InvalidField(fmt.Sprintf("%s[%q]", field, k), "key must be 1..%d characters of [A-Za-z0-9._/-]", MaxLabelKey)
		}
		if len(v) > MaxLabelValue || !utf8.ValidString(v) {
			return errdefs.InvalidField(fmt.Sprintf("%s[%q]", field, k), "value must be valid UTF-8 of at most %d bytes", MaxLabelValue)
		}
	}
	return nil
}

func envKeyOK(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Env checks a session environment: names [A-Za-z_][A-Za-z0-9_]*, none
// under ReservedEnvPrefix, no NUL in values.
func Env(field string, env map[string]string) error {
	if len(env) > MaxEnv {
		return errdefs.InvalidField(field, "%d variables, at most %d", len(env), MaxEnv)
	}
	for k, v := range env {
		f := fmt.Sprintf("%s[%q]", field, k)
		switch {
		case !envKeyOK(k):
			return errdefs.InvalidField(f, "name must match [A-Za-z_][A-Za-z0-9_]*")
		case strings.HasPrefix(strings.ToUpper(k), ReservedEnvPrefix):
			return errdefs.InvalidField(f, "the %s prefix is reserved for forkfleet", ReservedEnvPrefix)
		case strings.IndexByte(v, 0) >= 0:
			return errdefs.InvalidField(f, "value contains a NUL byte")
		case len(v) > MaxEnvValue:
			return errdefs.InvalidField(f, "value longer than %d bytes", MaxEnvValue)
		}
	}
	return nil
}

// Duration checks an optional duration; zero means absent.
func Duration(field string, d *durationpb.Duration, max time.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, errdefs.InvalidField(field, "%v", err)
	}
	v := d.AsDuration()
	if v <= 0 || v > max {
		return 0, errdefs.InvalidField(field, "%v out of range: must be positive and at most %v", v, max)
	}
	return v, nil
}

// Name checks an optional human name of a checkpoint or pool.
func Name(field, name string) error {
	if name == "" {
		return nil
	}
	if len(name) > MaxName || !utf8.ValidString(name) {
		return errdefs.InvalidField(field, "must be valid UTF-8 of at most %d bytes", MaxName)
	}
	if strings.HasPrefix(name, PrefixCheckpoint) || strings.HasPrefix(name, PrefixPool) || strings.HasPrefix(name, PrefixSandbox) {
		return errdefs.InvalidField(field, "must not start with an id prefix (sb-, ck-, pl-)")
	}
	if strings.TrimSpace(name) != name || strings.ContainsAny(name, "\x00\r\n\t") {
		return errdefs.InvalidField(field, "must not contain control characters or surrounding spaces")
	}
	return nil
}

// SandboxID checks a required sandbox id.
func SandboxID(field, id string) error {
	if id == "" {
		return errdefs.InvalidField(field, "required")
	}
	if !ValidID(PrefixSandbox, id) {
		return errdefs.InvalidField(field, "%q is not a sandbox id (sb-...)", id)
	}
	return nil
}

// PoolID checks a required pool id.
func PoolID(field, id string) error {
	if id == "" {
		return errdefs.InvalidField(field, "required")
	}
	if !ValidID(PrefixPool, id) {
		return errdefs.InvalidField(field, "%q is not a pool id (pl-...)", id)
	}
	return nil
}

// ForkSource checks what a ForkCheckpointRequest forks: exactly one of a
// local checkpoint (id or name) and a checkpoint image in a registry.
func ForkSource(req *controldv1.ForkCheckpointRequest) error {
	id, ref := req.GetCheckpointId(), req.GetCheckpointReference()
	switch {
	case id != "" && ref != "":
		return errdefs.InvalidField("checkpoint_reference", "set either checkpoint_id or checkpoint_reference, not both")
	case ref != "":
		return Image("checkpoint_reference", ref)
	}
	return CheckpointRef("checkpoint_id", id)
}

// CheckpointRef checks an "id or name" field.
func CheckpointRef(field, s string) error {
	if s == "" {
		return errdefs.InvalidField(field, "required")
	}
	if strings.HasPrefix(s, PrefixCheckpoint) && !ValidID(PrefixCheckpoint, s) {
		return errdefs.InvalidField(field, "%q is not a checkpoint id (ck-...)", s)
	}
	if len(s) > MaxName {
		return errdefs.InvalidField(field, "longer than %d bytes", MaxName)
	}
	return nil
}

// States checks a state filter.
func States(field string, states []controldv1.SandboxState) error {
	for i, s := range states {
		if _, ok := controldv1.SandboxState_name[int32(s)]; !ok || s == controldv1.SandboxState_SANDBOX_STATE_UNSPECIFIED {
			return errdefs.InvalidField(fmt.Sprintf("%s[%d]", field, i), "unknown state %d", s)
		}
	}
	return nil
}

// VerifyLevels resolves a request's verify list against what a checkpoint
// supports: empty means all supported, [NONE] means none.
func VerifyLevels(field string, req []controldv1.VerifyLevel, supported []controldv1.VerifyLevel) ([]controldv1.VerifyLevel, error) {
	if len(req) == 0 {
		return DefaultLevels(supported), nil
	}
	out := make([]controldv1.VerifyLevel, 0, len(req))
	seen := map[controldv1.VerifyLevel]bool{}
	for i, l := range req {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case l == controldv1.VerifyLevel_VERIFY_LEVEL_NONE:
			if len(req) != 1 {
				return nil, errdefs.InvalidField(f, "VERIFY_LEVEL_NONE cannot be combined with other levels")
			}
			return nil, nil
		case l == controldv1.VerifyLevel_VERIFY_LEVEL_UNSPECIFIED:
			return nil, errdefs.InvalidField(f, "unspecified verify level")
		case !containsLevel(supported, l):
			if _, ok := controldv1.VerifyLevel_name[int32(l)]; !ok {
				return nil, errdefs.InvalidField(f, "unknown verify level %d", l)
			}
			return nil, errdefs.InvalidField(f, "%s is not supported by this checkpoint (supported: %v)", l, supported)
		}
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	return out, nil
}

// DefaultLevels is what a fork is verified at when it asks for nothing:
// every level the checkpoint supports but FILESYSTEM, which reads every
// file the sandbox changed (ask for it).
func DefaultLevels(supported []controldv1.VerifyLevel) []controldv1.VerifyLevel {
	out := make([]controldv1.VerifyLevel, 0, len(supported))
	for _, l := range supported {
		if l != controldv1.VerifyLevel_VERIFY_LEVEL_FILESYSTEM {
			out = append(out, l)
		}
	}
	return out
}

func containsLevel(ls []controldv1.VerifyLevel, l controldv1.VerifyLevel) bool {
	for _, x := range ls {
		if x == l {
			return true
		}
	}
	return false
}

// MatchLabels reports whether have carries every want label.
func MatchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// FieldIndex names element i of a repeated field.
func FieldIndex(field string, i int) string { return fmt.Sprintf("%s[%d]", field, i) }

// TTL checks an optional time to live (absent: none): positive, at most
// MaxTTL.
func TTL(field string, d *durationpb.Duration) (time.Duration, error) {
	return Duration(field, d, MaxTTL)
}

// RequiredTTL is TTL for a field that must be set.
func RequiredTTL(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, errdefs.InvalidField(field, "required")
	}
	return TTL(field, d)
}

// PoolSize checks a pool's target size.
func PoolSize(field string, n uint32) error {
	if n < 1 || n > MaxPoolSize {
		return errdefs.InvalidField(field, "%d out of range 1..%d", n, MaxPoolSize)
	}
	return nil
}

// ForkCount checks how many replicas a fork asks for.
func ForkCount(field string, n uint32) error {
	if n < 1 || n > MaxForkCount {
		return errdefs.InvalidField(field, "%d out of range 1..%d", n, MaxForkCount)
	}
	return nil
}

// Tier resolves a checkpoint tier (unspecified: memory).
func Tier(field string, t controldv1.CheckpointTier) (controldv1.CheckpointTier, error) {
	switch t {
	case controldv1.CheckpointTier_CHECKPOINT_TIER_UNSPECIFIED:
		return controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, nil
	case controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, controldv1.CheckpointTier_CHECKPOINT_TIER_DISK:
		return t, nil
	}
	return 0, errdefs.InvalidField(field, "unknown tier %d", t)
}

// RestoreMode checks a fork's restore mode for a checkpoint of tier and
// returns it, AUTO when unspecified. Lazy restore serves a memory-tier
// replica's pages: a disk-tier replica boots fresh and has none.
func RestoreMode(field string, m controldv1.RestoreMode, tier controldv1.CheckpointTier) (controldv1.RestoreMode, error) {
	switch m {
	case controldv1.RestoreMode_RESTORE_MODE_UNSPECIFIED:
		return controldv1.RestoreMode_RESTORE_MODE_AUTO, nil
	case controldv1.RestoreMode_RESTORE_MODE_EAGER, controldv1.RestoreMode_RESTORE_MODE_AUTO:
		return m, nil
	case controldv1.RestoreMode_RESTORE_MODE_LAZY:
		if tier == controldv1.CheckpointTier_CHECKPOINT_TIER_DISK {
			return 0, errdefs.InvalidField(field, "lazy restore applies to memory-tier checkpoints; this one is disk tier")
		}
		return m, nil
	}
	return 0, errdefs.InvalidField(field, "unknown restore mode %d", m)
}

// View tickets (CreateViewTicket): how long one can be redeemed.
const (
	DefaultViewTicketTTL = time.Minute
	MaxViewTicketTTL     = 10 * time.Minute
)

// ViewTicketTTL checks a view ticket's optional ttl and returns the
// effective one (DefaultViewTicketTTL when absent).
func ViewTicketTTL(field string, d *durationpb.Duration) (time.Duration, error) {
	v, err := Duration(field, d, MaxViewTicketTTL)
	if err != nil {
		return 0, err
	}
	if v == 0 {
		v = DefaultViewTicketTTL
	}
	return v, nil
}
