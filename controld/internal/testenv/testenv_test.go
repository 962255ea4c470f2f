package testenv

import "testing"

// The tripwire must hold on any healthy Linux host, or every real-stack test
// would fail on it for the wrong reason.
func TestHostDevices(t *testing.T) {
	if err := hostDevices(); err != nil {
		t.Fatal(err)
	}
}
