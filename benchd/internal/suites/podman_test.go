//go:build linux

package suites

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestCRIUErrors reads why a podman restore failed from the CRIU log its
// error names (as runc words it), and nothing when the log is gone or not
// named.
func TestCRIUErrors(t *testing.T) {
	log := filepath.Join(t.TempDir(), "restore.log")
	if err := os.WriteFile(log, []byte(`(00.003585) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.005000) Collected [usr/lib/x86_64-linux-gnu/libgpg-error.so.0.33.1] ID 0x2f
(00.562411)     59: Error (criu/files-reg.c:2175): File home/agent/.config/chromium/Default/Local Storage/leveldb/000003.log has bad size 49 (expect 30)
(00.562418)     59: Error (criu/files.c:1221): Unable to open fd=19 id=0x1d5
(00.565781)     26: Error (criu/files-reg.c:2175): File home/agent/.config/chromium/Default/History-journal has bad size 8720 (expect 0)
(00.693791) Error (criu/cr-restore.c:2331): Restoring FAILED.
`), 0o644); err != nil {
		t.Fatal(err)
	}
	err := errors.New("podman container restore: exit status 125: Error: OCI runtime error: runc: criu failed: type NOTIFY errno 0\nlog file: " + log)
	want := "(00.003585) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted; " +
		"(00.562411)     59: Error (criu/files-reg.c:2175): File home/agent/.config/chromium/Default/Local Storage/leveldb/000003.log has bad size 49 (expect 30); " +
		"(00.562418)     59: Error (criu/files.c:1221): Unable to open fd=19 id=0x1d5; " +
		"(00.565781)     26: Error (criu/files-reg.c:2175): File home/agent/.config/chromium/Default/History-journal has bad size 8720 (expect 0); " +
		"(00.693791) Error (criu/cr-restore.c:2331): Restoring FAILED."
	if got := criuErrors(err); got != want {
		t.Fatalf("criuErrors:\n got %q\nwant %q", got, want)
	}
	if got := criuErrors(errors.New("criu failed: type NOTIFY errno 0\nlog file: " + log + ".gone")); got != "" {
		t.Fatalf("a removed log: %q", got)
	}
	if got := criuErrors(errors.New("podman: exit status 125")); got != "" {
		t.Fatalf("no log named: %q", got)
	}
}
