package aci

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// warmCodecs reaches every message type of the ACI protocol, nested ones
// included: a request or reply kind added later is warmed too.
func TestWarmCodecsCoversTheProtocol(t *testing.T) {
	want := 0
	var count func(ms protoreflect.MessageDescriptors)
	count = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			if md := ms.Get(i); !md.IsMapEntry() {
				want++
				count(md.Messages())
			}
		}
	}
	count(aciv1.File_forkfleet_aci_v1_aci_proto.Messages())
	if want < 50 {
		t.Fatalf("the ACI file has %d message types: the descriptor walk is broken", want)
	}
	if got := warmCodecs(); got < want {
		t.Errorf("warmed %d message types, the ACI protocol has %d", got, want)
	}
}

func BenchmarkWarmCodecs(b *testing.B) {
	for i := 0; i < b.N; i++ {
		warmCodecs()
	}
}
