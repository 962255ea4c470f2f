package fleet

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Limits of request fields.
const (
	maxLabels      = 64
	maxLabelKey    = 63
	maxLabelValue  = 256
	maxEnv         = 128
	maxEnvValue    = 32 << 10
	maxImageRef    = 512
	maxName        = 128
	maxTTL         = 30 * 24 * time.Hour
	maxWaitTimeout = time.Hour
	minScreenEdge  = 64
	maxScreenEdge  = 8192
	maxForkCount   = 64
	maxPoolSize    = 64
)

// PoolIDLabel is the label a claimed sandbox carries naming its pool.
const PoolIDLabel = "pool_id"

// reservedEnvPrefix is the runtime's own namespace in a sandbox's
// environment (tokens, geometry); requests may not set it.
const reservedEnvPrefix = "FORKFLEET_"

func validateImage(field, ref string) error {
	switch {
	case len(ref) > maxImageRef:
		return errdefs.InvalidField(field, "longer than %d bytes", maxImageRef)
	case strings.ContainsAny(ref, " \t\r\n"):
		return errdefs.InvalidField(field, "contains whitespace")
	case ref != "" && !utf8.ValidString(ref):
		return errdefs.InvalidField(field, "not valid UTF-8")
	}
	return nil
}

func validateScreen(field string, s *controldv1.Screen) error {
	if s == nil {
		return nil
	}
	if w := s.GetWidth(); w < minScreenEdge || w > maxScreenEdge {
		return errdefs.InvalidField(field+".width", "%d out of range %d..%d", w, minScreenEdge, maxScreenEdge)
	}
	if h := s.GetHeight(); h < minScreenEdge || h > maxScreenEdge {
		return errdefs.InvalidField(field+".height", "%d out of range %d..%d", h, minScreenEdge, maxScreenEdge)
	}
	switch s.GetDepth() {
	case 0, 8, 15, 16, 24, 30:
	default:
		return errdefs.InvalidField(field+".depth", "%d: must be 8, 15, 16, 24 or 30 (0 means 24)", s.GetDepth())
	}
	return nil
}

func labelKeyOK(k string) bool {
	if k == "" || len(k) > maxLabelKey {
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

func validateLabels(field string, labels map[string]string) error {
	if len(labels) > maxLabels {
		return errdefs.InvalidField(field, "%d labels, at most %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		if !labelKeyOK(k) {
			return errdefs.InvalidField(fmt.Sprintf("%s[%q]", field, k), "key must be 1..%d characters of [A-Za-z0-9._/-]", maxLabelKey)
		}
		if len(v) > maxLabelValue || !utf8.ValidString(v) {
			return errdefs.InvalidField(fmt.Sprintf("%s[%q]", field, k), "value must be valid UTF-8 of at most %d bytes", maxLabelValue)
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

func validateEnv(field string, env map[string]string) error {
	if len(env) > maxEnv {
		return errdefs.InvalidField(field, "%d variables, at most %d", len(env), maxEnv)
	}
	for k, v := range env {
		f := fmt.Sprintf("%s[%q]", field, k)
		switch {
		case !envKeyOK(k):
			return errdefs.InvalidField(f, "name must match [A-Za-z_][A-Za-z0-9_]*")
		case strings.HasPrefix(strings.ToUpper(k), reservedEnvPrefix):
			return errdefs.InvalidField(f, "the %s prefix is reserved for forkfleet", reservedEnvPrefix)
		case strings.IndexByte(v, 0) >= 0:
			return errdefs.InvalidField(f, "value contains a NUL byte")
		case len(v) > maxEnvValue:
			return errdefs.InvalidField(f, "value longer than %d bytes", maxEnvValue)
		}
	}
	return nil
}

// durationField checks an optional duration; zero means absent.
func durationField(field string, d *durationpb.Duration, max time.Duration) (time.Duration, error) {
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

func validateName(field, name string) error {
	if name == "" {
		return nil
	}
	if len(name) > maxName || !utf8.ValidString(name) {
		return errdefs.InvalidField(field, "must be valid UTF-8 of at most %d bytes", maxName)
	}
	if strings.HasPrefix(name, prefixCheckpoint) || strings.HasPrefix(name, prefixPool) || strings.HasPrefix(name, prefixSandbox) {
		return errdefs.InvalidField(field, "must not start with an id prefix (sb-, ck-, pl-)")
	}
	if strings.TrimSpace(name) != name || strings.ContainsAny(name, "\x00\r\n\t") {
		return errdefs.InvalidField(field, "must not contain control characters or surrounding spaces")
	}
	return nil
}

func validateSandboxID(field, id string) error {
	if id == "" {
		return errdefs.InvalidField(field, "required")
	}
	if !validID(prefixSandbox, id) {
		return errdefs.InvalidField(field, "%q is not a sandbox id (sb-...)", id)
	}
	return nil
}

func validatePoolID(field, id string) error {
	if id == "" {
		return errdefs.InvalidField(field, "required")
	}
	if !validID(prefixPool, id) {
		return errdefs.InvalidField(field, "%q is not a pool id (pl-...)", id)
	}
	return nil
}

// validateCheckpointRef checks an "id or name" field.
func validateCheckpointRef(field, s string) error {
	if s == "" {
		return errdefs.InvalidField(field, "required")
	}
	if strings.HasPrefix(s, prefixCheckpoint) && !validID(prefixCheckpoint, s) {
		return errdefs.InvalidField(field, "%q is not a checkpoint id (ck-...)", s)
	}
	if len(s) > maxName {
		return errdefs.InvalidField(field, "longer than %d bytes", maxName)
	}
	return nil
}

func validateStates(field string, states []controldv1.SandboxState) error {
	for i, s := range states {
		if _, ok := controldv1.SandboxState_name[int32(s)]; !ok || s == controldv1.SandboxState_SANDBOX_STATE_UNSPECIFIED {
			return errdefs.InvalidField(fmt.Sprintf("%s[%d]", field, i), "unknown state %d", s)
		}
	}
	return nil
}

// verifyLevels resolves a request's verify list against what a checkpoint
// supports: empty means all supported, [NONE] means none.
func verifyLevels(field string, req []controldv1.VerifyLevel, supported []controldv1.VerifyLevel) ([]controldv1.VerifyLevel, error) {
	if len(req) == 0 {
		return defaultLevels(supported), nil
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

// defaultLevels is what a fork is verified at when it asks for nothing:
// every level the checkpoint supports but FILESYSTEM, which reads every
// file the sandbox changed (ask for it).
func defaultLevels(supported []controldv1.VerifyLevel) []controldv1.VerifyLevel {
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

// matchLabels reports whether have carries every want label.
func matchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

func fieldIndex(field string, i int) string { return fmt.Sprintf("%s[%d]", field, i) }
