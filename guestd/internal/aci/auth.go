package aci

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// Role is what a session's token entitles it to.
type Role int

const (
	// RoleNone: no valid token.
	RoleNone Role = iota
	// RoleAgent: the per-sandbox ACI token, given to agents.
	RoleAgent
	// RoleAdmin: controld's admin token; may also send memory_mark and
	// restored.
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleAgent:
		return "agent"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// tokens holds SHA-256 digests so comparisons are constant time regardless of
// the presented token's length. Replaced as a whole (atomic pointer) by
// RestoredRequest.
type tokens struct {
	aci, admin [32]byte
	hasACI     bool
	hasAdmin   bool
}

func newTokens(aci, admin string) *tokens {
	t := &tokens{hasACI: aci != "", hasAdmin: admin != ""}
	if t.hasACI {
		t.aci = sha256.Sum256([]byte(aci))
	}
	if t.hasAdmin {
		t.admin = sha256.Sum256([]byte(admin))
	}
	return t
}

// role checks a presented token against both roles. Both comparisons always
// run so timing does not reveal which one matched.
func (t *tokens) role(presented string) Role {
	if presented == "" {
		return RoleNone
	}
	d := sha256.Sum256([]byte(presented))
	admin := subtle.ConstantTimeCompare(d[:], t.admin[:]) & boolInt(t.hasAdmin)
	agent := subtle.ConstantTimeCompare(d[:], t.aci[:]) & boolInt(t.hasACI)
	switch {
	case admin == 1:
		return RoleAdmin
	case agent == 1:
		return RoleAgent
	}
	return RoleNone
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	const p = "Bearer "
	if len(h) < len(p) || !strings.EqualFold(h[:len(p)], p) {
		return ""
	}
	return strings.TrimSpace(h[len(p):])
}
