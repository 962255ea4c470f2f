package desktoptest

import (
	"errors"
	"os"
	"path/filepath"
)

// RepoRoot walks up from dir to the directory holding go.work, the
// forkfleet monorepo's root; "" when there is none.
func RepoRoot(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

var errNoRepo = errors.New("no monorepo (a directory holding go.work) above the working directory")
