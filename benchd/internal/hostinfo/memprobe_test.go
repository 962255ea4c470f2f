package hostinfo

import "testing"

func TestParseHypervisorRecord(t *testing.T) {
	for _, c := range []struct {
		rec, want string
		ok        bool
	}{
		{"6,1,0,-;Hypervisor detected: PVM\n", "PVM", true},
		{"6,2,0,-;Hypervisor detected: KVM\n SUBSYSTEM=x\n", "KVM", true},
		{"6,3,0,-;Hypervisor detected: Microsoft Hyper-V", "Microsoft Hyper-V", true},
		{"6,4,0,-;Hypervisor detected: \n", "", false},
		{"6,5,0,-;Linux version 6.18\n", "", false},
		{"Hypervisor detected: KVM\n", "", false}, // not a record
	} {
		got, ok := parseHypervisorRecord(c.rec)
		if got != c.want || ok != c.ok {
			t.Errorf("%q: got %q %v, want %q %v", c.rec, got, ok, c.want, c.ok)
		}
	}
}

func TestPageTouchNs(t *testing.T) {
	ns := PageTouchNs()
	// A first write faults, zeroes a page and maps it: tens of ns at the
	// very least, and not a second.
	if ns < 10 || ns > 1e9 {
		t.Fatalf("page touch %v ns", ns)
	}
	t.Logf("first write to a 4 KiB page: %.0f ns; hypervisor %q", ns, Hypervisor())
}
