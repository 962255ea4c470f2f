// Package atomicfile replaces a file's content in one step: readers see the
// old content or the new one, never a part (write a temporary file beside
// it, then rename over it).
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with data and mode perm. It does not fsync: callers
// that must survive a crash sync the directory themselves once they have
// written all their files.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
