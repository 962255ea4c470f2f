package controldfake

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
)

// Server is a Fake serving gRPC on a unix socket.
type Server struct {
	*Fake
	// Target is the client.Dial target: "unix:///path/controld.sock".
	Target string
	// SocketPath is the socket's file system path.
	SocketPath string

	grpc      *grpc.Server
	done      chan error
	closeOnce sync.Once
	closeErr  error
}

// Listen serves a new Fake on a unix socket at socketPath (replacing a stale
// socket file).
func Listen(socketPath string) (*Server, error) {
	return ListenFake(New(), socketPath)
}

// ListenFake serves f on a unix socket at socketPath.
func ListenFake(f *Fake, socketPath string) (*Server, error) {
	if err := os.Remove(socketPath); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	ln, err := net.Listen("unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("controldfake: %w", err)
	}
	gs := grpc.NewServer(f.ServerOptions()...)
	f.Register(gs)
	s := &Server{Fake: f, Target: "unix://" + socketPath, SocketPath: socketPath, grpc: gs, done: make(chan error, 1)}
	go func() { s.done <- gs.Serve(ln) }()
	return s, nil
}

// Close stops the server (ending open streams) and the fake's timers.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.Fake.Close()
		s.grpc.Stop()
		err := <-s.done
		os.Remove(s.SocketPath)
		if err != grpc.ErrServerStopped {
			s.closeErr = err
		}
	})
	return s.closeErr
}

// Start serves a new Fake on a unix socket in a temporary directory for the
// duration of the test and returns it; dial s.Target.
func Start(tb testing.TB) *Server {
	tb.Helper()
	// Unix socket paths are short (108 bytes): t.TempDir() can be too long.
	dir, err := os.MkdirTemp("", "controldfake")
	if err != nil {
		tb.Fatal(err)
	}
	s, err := Listen(filepath.Join(dir, "controld.sock"))
	if err != nil {
		os.RemoveAll(dir)
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		s.Close()
		os.RemoveAll(dir)
	})
	return s
}

// StartContext serves a new Fake until ctx is done (for programs, e.g.
// benchd with a fake control plane).
func StartContext(ctx context.Context, socketPath string) (*Server, error) {
	s, err := Listen(socketPath)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { s.Close() })
	return s, nil
}
