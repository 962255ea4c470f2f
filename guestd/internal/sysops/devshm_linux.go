package sysops

import (
	"errors"
	"io/fs"
	"os"
)

// EnsureDevShm makes /dev/shm a world-writable sticky directory when it is
// missing. controld gives it no tmpfs of its own, since CRIU tars every
// tmpfs on each dump and restore, so POSIX shared memory lives in /dev's
// tmpfs, which is sized for it.
func EnsureDevShm(dir string) error {
	if fi, err := os.Lstat(dir); err == nil {
		if !fi.IsDir() {
			return &fs.PathError{Op: "ensure", Path: dir, Err: errors.New("exists and is not a directory")}
		}
		return nil
	}
	if err := os.Mkdir(dir, 0o777); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// Mkdir's mode passes the umask and cannot set the sticky bit.
	return os.Chmod(dir, 0o777|fs.ModeSticky)
}
