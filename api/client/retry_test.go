package client_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/controldfake"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// flaky is the fake controld answering UNAVAILABLE (a controld starting or
// restarting) to the first fails calls of each method.
type flaky struct {
	*controldfake.Fake
	fails int

	mu    sync.Mutex
	calls map[string]int
}

func (f *flaky) fail(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if f.calls[method] <= f.fails {
		return status.Error(codes.Unavailable, "controld is starting")
	}
	return nil
}

func (f *flaky) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *flaky) GetSandbox(ctx context.Context, req *controldv1.GetSandboxRequest) (*controldv1.GetSandboxResponse, error) {
	if err := f.fail("GetSandbox"); err != nil {
		return nil, err
	}
	return f.Fake.GetSandbox(ctx, req)
}

// CreateSandbox creates, then loses its first answers (the connection
// drops after controld did the work).
func (f *flaky) CreateSandbox(ctx context.Context, req *controldv1.CreateSandboxRequest) (*controldv1.CreateSandboxResponse, error) {
	resp, err := f.Fake.CreateSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := f.fail("CreateSandbox"); err != nil {
		return nil, err
	}
	return resp, nil
}

func (f *flaky) SuspendSandbox(ctx context.Context, req *controldv1.SuspendSandboxRequest) (*controldv1.SuspendSandboxResponse, error) {
	if err := f.fail("SuspendSandbox"); err != nil {
		return nil, err
	}
	return f.Fake.SuspendSandbox(ctx, req)
}

// Idempotent calls are retried on UNAVAILABLE (the service config Dial
// applies); others are not: a repeat could act twice.
func TestRetryPolicy(t *testing.T) {
	dir, err := os.MkdirTemp("", "retry")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "c.sock"))
	if err != nil {
		t.Fatal(err)
	}
	f := &flaky{Fake: controldfake.New(), fails: 2, calls: map[string]int{}}
	t.Cleanup(f.Fake.Close)
	gs := grpc.NewServer()
	controldv1.RegisterSandboxServiceServer(gs, f)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "unix://"+ln.Addr().String(), client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cr, err := f.Fake.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	id := cr.GetSandbox().GetId()

	if _, err := c.Sandbox(id).Get(ctx); err != nil {
		t.Fatalf("GetSandbox through two UNAVAILABLE answers: %v", err)
	}
	if n := f.count("GetSandbox"); n != 3 {
		t.Fatalf("GetSandbox attempts: %d, want 3", n)
	}
	// A create whose answers were lost is retried with the same request id
	// (the client set one): one sandbox, not three.
	created, err := c.CreateSandbox(ctx, client.WithLabels(map[string]string{"lost": "answers"}))
	if err != nil {
		t.Fatalf("CreateSandbox through two lost answers: %v", err)
	}
	if n := f.count("CreateSandbox"); n != 3 {
		t.Fatalf("CreateSandbox attempts: %d, want 3", n)
	}
	l, _ := f.Fake.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{Labels: map[string]string{"lost": "answers"}})
	if len(l.GetSandboxes()) != 1 || l.GetSandboxes()[0].GetId() != created.ID() {
		t.Fatalf("sandboxes after retried creates: %v", l.GetSandboxes())
	}
	// Suspend is not in the retry policy: the first UNAVAILABLE is the
	// caller's to judge.
	if err := c.Sandbox(id).Suspend(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Suspend: %v, want UNAVAILABLE", err)
	}
	if n := f.count("SuspendSandbox"); n != 1 {
		t.Fatalf("SuspendSandbox attempts: %d, want 1", n)
	}
}
