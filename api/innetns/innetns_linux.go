// Package innetns runs code inside a network namespace: the one helper that
// controld's network setup, its tests, benchd's network suite and the node
// pod's tests share.
package innetns

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs fn on an OS thread that has joined the network namespace at path
// (a bind-mounted namespace or /proc/<pid>/ns/net). Sockets fn creates stay in
// that namespace, and processes it starts (os/exec forks from the calling
// thread) run in it. The thread is never handed back to the scheduler: it
// exits with fn, so no other goroutine can run in the namespace by accident.
func Run(path string, fn func() error) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer unix.Close(fd)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
