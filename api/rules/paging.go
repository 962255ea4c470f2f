package rules

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// MaxPageSize bounds (and is the default of) a List call's page_size.
const MaxPageSize = 1000

// token is what a next_page_token holds: where the page ended and the
// filters it was for.
type token struct {
	After  string `json:"a"`
	Filter []byte `json:"f"`
}

// Page returns the page of items (any order; Page sorts them by key, which
// must be unique: SandboxKey, CheckpointKey, PoolKey) that a List request
// asks for with pageSize and pageToken, and the token of the next page (""
// after the last). filter is the request: its fingerprint without the page
// fields binds a token to the filters it was made for. Items created or
// deleted between pages do not shift the others.
func Page[T any](items []T, key func(T) string, pageSize int32, pageToken string, filter proto.Message) ([]T, string, error) {
	id := key
	size := int(pageSize)
	switch {
	case size < 0 || size > MaxPageSize:
		return nil, "", errdefs.InvalidField("page_size", "%d out of range 0..%d (0: %d)", size, MaxPageSize, MaxPageSize)
	case size == 0:
		size = MaxPageSize
	}
	fp := Fingerprint(filter, "page_size", "page_token")
	after := ""
	if pageToken != "" {
		t, err := decodeToken(pageToken)
		if err != nil {
			return nil, "", errdefs.InvalidField("page_token", "not a next_page_token of this List call")
		}
		if string(t.Filter) != string(fp) {
			return nil, "", errdefs.InvalidField("page_token", "made for other filters: repeat the filters of the first page")
		}
		after = t.After
	}
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b T) int { return strings.Compare(id(a), id(b)) })
	start, _ := slices.BinarySearchFunc(sorted, after, func(it T, after string) int {
		if id(it) <= after {
			return -1
		}
		return 1
	})
	if after == "" {
		start = 0
	}
	end := min(start+size, len(sorted))
	page := sorted[start:end]
	if end == len(sorted) {
		return page, "", nil
	}
	b, _ := json.Marshal(token{After: id(sorted[end-1]), Filter: fp})
	return page, base64.RawURLEncoding.EncodeToString(b), nil
}

func decodeToken(s string) (token, error) {
	var t token
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return t, err
	}
	err = json.Unmarshal(b, &t)
	return t, err
}

// SandboxKey orders sandboxes oldest first (created_at, then id).
func SandboxKey(s *controldv1.Sandbox) string { return createdKey(s.GetCreatedAt(), s.GetId()) }

// CheckpointKey orders checkpoints oldest first (created_at, then id).
func CheckpointKey(c *controldv1.Checkpoint) string { return createdKey(c.GetCreatedAt(), c.GetId()) }

// PoolKey orders pools by id.
func PoolKey(p *controldv1.Pool) string { return p.GetId() }

// createdKey sorts as the time, then the id (fixed-width nanoseconds).
func createdKey(t *timestamppb.Timestamp, id string) string {
	return fmt.Sprintf("%020d/%s", max(t.AsTime().UnixNano(), 0), id)
}
