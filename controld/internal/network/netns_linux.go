//go:build linux

package network

import (
	"os"
)

// newPin makes the empty file a sandbox's network namespace is bound to
// once the namespace exists (Attach).
func newPin(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	return f.Close()
}

// writeSysctl sets a /proc/sys/net value of the calling thread's namespace
// (call it inside netnsfile.Run).
func writeSysctl(name, value string) error {
	return os.WriteFile("/proc/sys/"+name, []byte(value), 0o644)
}
