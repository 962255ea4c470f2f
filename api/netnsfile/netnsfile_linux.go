// Package netnsfile handles network namespaces kept as files (a bind mount
// of a namespace, or /proc/<pid>/ns/net): New binds a new one at a path, Run
// runs code inside one, Remove unbinds one. controld's network setup, its
// tests, benchd's network suite and the node pod tests share it.
package netnsfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// New creates a network namespace and bind-mounts it at path, which must not
// exist. The namespace is made on a thread of its own that exits afterwards,
// so no thread of the caller is ever left in it.
func New(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// Run runs fn on an OS thread that has joined the network namespace at path.
// Sockets fn creates stay in that namespace, and processes it starts
// (os/exec forks from the calling thread) run in it. The thread is never
// handed back to the scheduler: it exits with fn, so no other goroutine can
// run in the namespace by accident.
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

// Remove unmounts and removes a namespace's file (bound or not); the
// namespace itself goes once nothing else holds it. A missing path is not an
// error.
func Remove(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
