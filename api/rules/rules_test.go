package rules_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
)

type memStore struct {
	mu sync.Mutex
	m  map[string]*rules.RequestRecord
}

func (s *memStore) GetRequest(key string) (*rules.RequestRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key], nil
}

func (s *memStore) PutRequest(r *rules.RequestRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*rules.RequestRecord{}
	}
	s.m[r.Key] = r
	return nil
}

const method = "/forkfleet.controld.v1.SandboxService/CreateSandbox"

func newResp() proto.Message { return &controldv1.CreateSandboxResponse{} }

func TestDedup(t *testing.T) {
	now := time.Unix(1000, 0)
	d := &rules.Dedup{Store: &memStore{}, Now: func() time.Time { return now }}
	ctx := context.Background()
	var runs atomic.Int32
	release := make(chan struct{})
	call := func(context.Context, rules.Request) (proto.Message, error) {
		n := runs.Add(1)
		<-release
		return &controldv1.CreateSandboxResponse{Sandbox: &controldv1.Sandbox{Id: fmt.Sprintf("sb-%d", n)}}, nil
	}
	req := &controldv1.CreateSandboxRequest{Image: "img", RequestId: "r1"}

	// Three concurrent calls with one id: one runs, all get its result.
	var wg sync.WaitGroup
	ids := make([]string, 3)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := d.Do(ctx, method, "r1", req, newResp, nil, call)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = resp.(*controldv1.CreateSandboxResponse).GetSandbox().GetId()
		}()
	}
	time.Sleep(50 * time.Millisecond) // the repeats are waiting on the first
	close(release)
	wg.Wait()
	if runs.Load() != 1 || ids[0] != "sb-1" || ids[1] != "sb-1" || ids[2] != "sb-1" {
		t.Fatalf("runs %d, results %v", runs.Load(), ids)
	}
	// A later repeat comes from the store; another id runs again.
	if resp, _ := d.Do(ctx, method, "r1", req, newResp, nil, call); resp.(*controldv1.CreateSandboxResponse).GetSandbox().GetId() != "sb-1" || runs.Load() != 1 {
		t.Fatal("repeat ran again")
	}
	if resp, _ := d.Do(ctx, method, "r2", req, newResp, nil, call); resp.(*controldv1.CreateSandboxResponse).GetSandbox().GetId() != "sb-2" {
		t.Fatal("another id did not run")
	}
	// The same id for another request is refused, naming the field.
	other := &controldv1.CreateSandboxRequest{Image: "other", RequestId: "r1"}
	if _, err := d.Do(ctx, method, "r1", other, newResp, nil, call); !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "request_id" {
		t.Fatalf("reused id: %v", err)
	}
	// Ids expire.
	now = now.Add(rules.RequestIDTTL + time.Second)
	if resp, _ := d.Do(ctx, method, "r1", req, newResp, nil, call); resp.(*controldv1.CreateSandboxResponse).GetSandbox().GetId() != "sb-3" {
		t.Fatal("an expired id was remembered")
	}
	// Bad ids are refused before anything runs.
	if _, err := d.Do(ctx, method, "has space", req, newResp, nil, call); errdefs.Field(err) != "request_id" {
		t.Fatalf("bad id: %v", err)
	}
}

// A first call that failed is run again, unless recover finds what it
// created (after a timeout or a restart).
func TestDedupFailureAndRecover(t *testing.T) {
	d := &rules.Dedup{Store: &memStore{}}
	ctx := context.Background()
	req := &controldv1.CreateSandboxRequest{RequestId: "x"}
	fail := func(context.Context, rules.Request) (proto.Message, error) { return nil, errdefs.ErrUnavailable }
	if _, err := d.Do(ctx, method, "x", req, newResp, nil, fail); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatal(err)
	}
	ok := func(context.Context, rules.Request) (proto.Message, error) {
		return &controldv1.CreateSandboxResponse{Sandbox: &controldv1.Sandbox{Id: "fresh"}}, nil
	}
	if resp, err := d.Do(ctx, method, "x", req, newResp, nil, ok); err != nil || resp.(*controldv1.CreateSandboxResponse).GetSandbox().GetId() != "fresh" {
		t.Fatalf("after a failure: %v %v", resp, err)
	}
	found := func(_ context.Context, key string, fp []byte) (proto.Message, bool, error) {
		if key != rules.RequestKey(method, "y") || len(fp) != 32 {
			t.Errorf("recover(%q, %x)", key, fp)
		}
		return &controldv1.CreateSandboxResponse{Sandbox: &controldv1.Sandbox{Id: "left-by-the-first"}}, true, nil
	}
	resp, err := d.Do(ctx, method, "y", &controldv1.CreateSandboxRequest{RequestId: "y"}, newResp, found, ok)
	if err != nil || resp.(*controldv1.CreateSandboxResponse).GetSandbox().GetId() != "left-by-the-first" {
		t.Fatalf("recovered: %v %v", resp, err)
	}
}

func TestPage(t *testing.T) {
	var items []string
	for i := range 25 {
		items = append(items, fmt.Sprintf("sb-%02d", 24-i)) // any order in
	}
	id := func(s string) string { return s }
	filter := &controldv1.ListSandboxesRequest{Labels: map[string]string{"a": "b"}}
	var got []string
	token := ""
	pages := 0
	for {
		f := proto.CloneOf(filter)
		f.PageSize, f.PageToken = 10, token
		page, next, err := rules.Page(items, id, f.PageSize, f.PageToken, f)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		pages++
		if next == "" {
			break
		}
		token = next
	}
	if pages != 3 || len(got) != 25 || got[0] != "sb-00" || got[24] != "sb-24" {
		t.Fatalf("%d pages: %v", pages, got)
	}
	// Items added before the cursor are not repeated, after it are seen.
	page, next, _ := rules.Page(items, id, 10, "", filter)
	items = append(items, "sb-00a", "sb-99")
	page2, _, _ := rules.Page(items, id, 100, next, filter)
	if page[9] != "sb-09" || page2[0] != "sb-10" || page2[len(page2)-1] != "sb-99" {
		t.Fatalf("pages around inserts: %v / %v", page, page2)
	}
	// A token is bound to its filters; garbage and bad sizes are refused.
	if _, _, err := rules.Page(items, id, 10, next, &controldv1.ListSandboxesRequest{}); errdefs.Field(err) != "page_token" {
		t.Fatalf("token for other filters: %v", err)
	}
	if _, _, err := rules.Page(items, id, 10, "!!", filter); errdefs.Field(err) != "page_token" {
		t.Fatalf("garbage token: %v", err)
	}
	for _, n := range []int32{-1, rules.MaxPageSize + 1} {
		if _, _, err := rules.Page(items, id, n, "", filter); errdefs.Field(err) != "page_size" {
			t.Fatalf("page_size %d: %v", n, err)
		}
	}
	if all, next, _ := rules.Page(items, id, 0, "", filter); len(all) != len(items) || next != "" {
		t.Fatal("page_size 0 is not the whole (small) list")
	}
}

func TestRequestIDSyntax(t *testing.T) {
	for _, ok := range []string{"", "0b1e4c2a-6f0e-4c8e-9b1a-2f3d4e5f6a7b", "job:42.retry_1"} {
		if err := rules.RequestID("request_id", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"a b", "é", string(make([]byte, 129)), "x/y"} {
		if err := rules.RequestID("request_id", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRestoreMode(t *testing.T) {
	mem, disk := controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, controldv1.CheckpointTier_CHECKPOINT_TIER_DISK
	for _, tc := range []struct {
		mode controldv1.RestoreMode
		tier controldv1.CheckpointTier
		want controldv1.RestoreMode
		ok   bool
	}{
		{controldv1.RestoreMode_RESTORE_MODE_UNSPECIFIED, mem, controldv1.RestoreMode_RESTORE_MODE_AUTO, true},
		{controldv1.RestoreMode_RESTORE_MODE_AUTO, disk, controldv1.RestoreMode_RESTORE_MODE_AUTO, true},
		{controldv1.RestoreMode_RESTORE_MODE_EAGER, disk, controldv1.RestoreMode_RESTORE_MODE_EAGER, true},
		{controldv1.RestoreMode_RESTORE_MODE_LAZY, mem, controldv1.RestoreMode_RESTORE_MODE_LAZY, true},
		{controldv1.RestoreMode_RESTORE_MODE_LAZY, disk, 0, false},
		{controldv1.RestoreMode(9), mem, 0, false},
	} {
		got, err := rules.RestoreMode("restore_mode", tc.mode, tc.tier)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("RestoreMode(%v, %v) = %v, %v", tc.mode, tc.tier, got, err)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("RestoreMode(%v, %v): %v is not INVALID_ARGUMENT", tc.mode, tc.tier, err)
		}
	}
}
