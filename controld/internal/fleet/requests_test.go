package fleet_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// forgetResponses drops every stored response of a request id, as if
// controld had crashed between doing the work and storing its answer: a
// repeat must then find the work through what it tagged.
func (e *env) forgetResponses() {
	e.t.Helper()
	if _, err := e.st.DeleteExpiredRequests(time.Now().Add(rules.RequestIDTTL + time.Hour)); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) count(req *controldv1.ListSandboxesRequest) int {
	e.t.Helper()
	l, _, err := e.m.ListSandboxes(context.Background(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(l)
}

func TestCreateSandboxRequestID(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	mine := map[string]string{"req": "r1"}
	req := &controldv1.CreateSandboxRequest{RequestId: "r1", WaitReady: true, Labels: mine}
	s1, ep1, err := e.m.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	boots := e.rt.Calls("boot")
	s2, ep2, err := e.m.CreateSandbox(ctx, req)
	if err != nil || s2.Id != s1.Id || ep2.Token != ep1.Token || e.rt.Calls("boot") != boots {
		t.Fatalf("repeat: %v %v (boots %d -> %d)", s2.GetId(), err, boots, e.rt.Calls("boot"))
	}
	// The same id for another request.
	_, _, err = e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{RequestId: "r1", Labels: map[string]string{"other": "x"}})
	wantCode(t, err, codes.InvalidArgument, "request_id")

	// After a restart: the stored answer.
	e.restart()
	if s3, _, err := e.m.CreateSandbox(ctx, req); err != nil || s3.Id != s1.Id {
		t.Fatalf("after a restart: %v %v", s3.GetId(), err)
	}
	// Crashed before the answer was stored: the tagged sandbox.
	e.forgetResponses()
	e.restart()
	if s4, _, err := e.m.CreateSandbox(ctx, req); err != nil || s4.Id != s1.Id {
		t.Fatalf("after a crash before the answer: %v %v", s4.GetId(), err)
	}
	if n := e.count(&controldv1.ListSandboxesRequest{Labels: mine}); n != 1 {
		t.Fatalf("%d sandboxes for one request id", n)
	}
}

// Repeats that arrive while the first call still runs wait for it and get
// its result.
func TestCreateSandboxRequestIDConcurrent(t *testing.T) {
	e := newEnv(t, nil)
	e.rt.ReadyAfter = 200 * time.Millisecond
	ctx := context.Background()
	req := &controldv1.CreateSandboxRequest{RequestId: "same", WaitReady: true, Labels: map[string]string{"req": "same"}}
	ids := make([]string, 4)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, err := e.m.CreateSandbox(ctx, req)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = s.Id
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("results %v", ids)
		}
	}
	if n := e.count(&controldv1.ListSandboxesRequest{Labels: map[string]string{"req": "same"}}); n != 1 {
		t.Fatalf("%d sandboxes", n)
	}
}

// A first call that failed and left nothing is run again; one that timed
// out while its sandbox kept booting is answered with that sandbox.
func TestCreateSandboxRequestIDAfterFailure(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.rt.BootErr = func(runtime.BootSpec) error {
		return errdefs.WithReason(errdefs.ErrUnavailable, "TEST", "boot refused")
	}
	req := &controldv1.CreateSandboxRequest{RequestId: "retry-me", WaitReady: true, Labels: map[string]string{"req": "retry"}}
	if _, _, err := e.m.CreateSandbox(ctx, req); err == nil {
		t.Fatal("boot did not fail")
	}
	e.rt.BootErr = nil
	s, _, err := e.m.CreateSandbox(ctx, req)
	if err != nil || s.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("retry after a failure: %v %v", s, err)
	}

	e.rt.ReadyAfter = 300 * time.Millisecond
	slow := &controldv1.CreateSandboxRequest{RequestId: "slow", WaitReady: true, Labels: map[string]string{"req": "slow"}}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, _, err := e.m.CreateSandbox(short, slow); !errors.Is(err, context.DeadlineExceeded) && errgrpc.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want its deadline", err)
	}
	s, _, err = e.m.CreateSandbox(ctx, slow)
	if err != nil || s.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("repeat after a timeout: %v %v", s, err)
	}
	if n := e.count(&controldv1.ListSandboxesRequest{Labels: map[string]string{"req": "slow"}}); n != 1 {
		t.Fatalf("%d sandboxes after a timeout and a repeat", n)
	}
}

func TestCheckpointForkClaimRequestIDs(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src := e.ready(nil)
	ckReq := &controldv1.CreateCheckpointRequest{SandboxId: src.Id, RequestId: "ck-1"}
	ck, err := e.m.CreateCheckpoint(ctx, ckReq)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := e.m.CreateCheckpoint(ctx, ckReq); err != nil || again.Id != ck.Id {
		t.Fatalf("checkpoint repeat: %v %v", again.GetId(), err)
	}
	forkReq := &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 2, RequestId: "fork-1", Labels: map[string]string{"req": "fork"}}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, forkReq))
	if err != nil || reps[0].ErrorCode != 0 || reps[1].ErrorCode != 0 {
		t.Fatal(reps, err)
	}
	if again, err := replicasOf(e.m.ForkCheckpoint(ctx, forkReq)); err != nil || again[0].Sandbox.Id != reps[0].Sandbox.Id || again[1].Sandbox.Id != reps[1].Sandbox.Id {
		t.Fatalf("fork repeat: %v %v", again, err)
	}
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: "img:latest"}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool filled", func() bool { got, _ := e.m.GetPool(ctx, p.Id); return got.Available == 1 })
	claimReq := &controldv1.ClaimPoolRequest{PoolId: p.Id, RequestId: "claim-1"}
	cs, _, hit, _, err := e.m.ClaimPool(ctx, claimReq)
	if err != nil || !hit {
		t.Fatalf("claim: %v %v", hit, err)
	}
	if again, _, hit2, _, err := e.m.ClaimPool(ctx, claimReq); err != nil || again.Id != cs.Id || !hit2 {
		t.Fatalf("claim repeat: %v %v %v", again.GetId(), hit2, err)
	}

	// Crashed before any answer was stored: each call finds what it made.
	e.forgetResponses()
	e.restart()
	if again, err := e.m.CreateCheckpoint(ctx, ckReq); err != nil || again.Id != ck.Id {
		t.Fatalf("checkpoint after a crash: %v %v", again.GetId(), err)
	}
	again, err := replicasOf(e.m.ForkCheckpoint(ctx, forkReq))
	if err != nil || again[0].GetSandbox().GetId() != reps[0].Sandbox.Id || again[1].GetSandbox().GetId() != reps[1].Sandbox.Id {
		t.Fatalf("fork after a crash: %v %v", again, err)
	}
	if c, _, hit, _, err := e.m.ClaimPool(ctx, claimReq); err != nil || c.Id != cs.Id || !hit {
		t.Fatalf("claim after a crash: %v %v %v", c.GetId(), hit, err)
	}
	if n := e.count(&controldv1.ListSandboxesRequest{Labels: map[string]string{"req": "fork"}}); n != 2 {
		t.Fatalf("%d replicas for one fork", n)
	}
	l, _, _ := e.m.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{})
	l = slices.DeleteFunc(l, func(c *controldv1.Checkpoint) bool { return c.Labels[rules.PoolIDLabel] != "" }) // the image pool's own
	if len(l) != 1 {
		t.Fatalf("%d checkpoints for one request", len(l))
	}
}

func TestListPages(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	var want []string
	for range 5 {
		want = append(want, e.ready(map[string]string{"page": "y"}).Id)
	}
	e.ready(map[string]string{"page": "n"})
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatal("too many pages")
		}
		l, next, err := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{Labels: map[string]string{"page": "y"}, PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range l {
			got = append(got, s.Id)
		}
		if next == "" {
			break
		}
		token = next
	}
	if len(got) != 5 {
		t.Fatalf("pages: %v", got)
	}
	for i := range want { // oldest first
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
	_, _, err := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{PageSize: 2, PageToken: token})
	wantCode(t, err, codes.InvalidArgument, "page_token") // the filters changed
	_, _, err = e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{PageSize: 5000})
	wantCode(t, err, codes.InvalidArgument, "page_size")
	for range 3 {
		if _, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: "img:latest"}, Size: 1}); err != nil {
			t.Fatal(err)
		}
	}
	pl, next, err := e.m.ListPools(ctx, &controldv1.ListPoolsRequest{PageSize: 2})
	if err != nil || len(pl) != 2 || next == "" {
		t.Fatalf("pools page 1: %d %q %v", len(pl), next, err)
	}
	if pl2, next2, err := e.m.ListPools(ctx, &controldv1.ListPoolsRequest{PageSize: 2, PageToken: next}); err != nil || len(pl2) != 1 || next2 != "" {
		t.Fatalf("pools page 2: %d %q %v", len(pl2), next2, err)
	}
}

func TestUpdatePool(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: "img:latest"}, Size: 1,
		Labels: map[string]string{"pool": "resize"}})
	if err != nil {
		t.Fatal(err)
	}
	avail := func() uint32 { got, _ := e.m.GetPool(ctx, p.Id); return got.Available }
	eventually(t, "filled", func() bool { return avail() == 1 })
	up, err := e.m.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: p.Id, Size: 3})
	if err != nil || up.Size != 3 {
		t.Fatalf("grow: %v %v", up, err)
	}
	eventually(t, "grown", func() bool { return avail() == 3 })
	down, err := e.m.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: p.Id, Size: 1})
	if err != nil || down.Size != 1 || down.Available > 1 {
		t.Fatalf("shrink: %v %v", down, err)
	}
	eventually(t, "members past the size removed", func() bool {
		return e.count(&controldv1.ListSandboxesRequest{Labels: map[string]string{"pool": "resize"}}) == 1
	})
	e.restart()
	if got, err := e.m.GetPool(ctx, p.Id); err != nil || got.Size != 1 {
		t.Fatalf("after a restart: %v %v", got, err)
	}
	_, err = e.m.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: p.Id, Size: 0})
	wantCode(t, err, codes.InvalidArgument, "size")
	_, err = e.m.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: "pl-aaaaaaaaaaaaaaaa", Size: 2})
	wantCode(t, err, codes.NotFound, "")
}

func TestExtendSandbox(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.ready(nil)
	ext, err := e.m.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: s.Id, Ttl: durationpb.New(time.Hour)})
	if err != nil || ext.ExpiresAt == nil || time.Until(ext.ExpiresAt.AsTime()) < 59*time.Minute {
		t.Fatalf("extend a sandbox without a TTL: %v %v", ext, err)
	}
	e.restart()
	if got, _ := e.m.GetSandbox(ctx, s.Id); got.ExpiresAt == nil {
		t.Fatal("the new expiry did not survive a restart")
	}
	// Shorter: the reaper takes it.
	if _, err := e.m.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: s.Id, Ttl: durationpb.New(20 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "expired", func() bool { _, err := e.m.GetSandbox(ctx, s.Id); return errgrpc.Code(err) == codes.NotFound })
	_, err = e.m.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: s.Id, Ttl: durationpb.New(time.Hour)})
	wantCode(t, err, codes.NotFound, "")
	s2 := e.ready(nil)
	_, err = e.m.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: s2.Id})
	wantCode(t, err, codes.InvalidArgument, "ttl")
	_, err = e.m.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: s2.Id, Ttl: durationpb.New(365 * 24 * time.Hour)})
	wantCode(t, err, codes.InvalidArgument, "ttl")
}
