package aci

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// warmCodecs builds the protobuf codec of every ACI message type (and of
// the types they import) now, at guestd's start, and returns how many.
//
// The protobuf runtime builds a message type's codec the first time a
// message of that type is encoded or decoded (its MessageInfo: struct
// layout, field coders, reflection functions). A type first used at a
// claim was built at the claim, in every pooled sandbox: a booted image
// pool member serves its first client session then, and a checkpoint
// pool's replica inherits only the codecs its source had built before the
// dump, so each replica built the rest again after its thaw (resume_apps,
// the claimant's ping, their replies): 8 to 9% of a claimed guestd's CPU in
// a burst's window, and memory written on pages KSM had merged (a
// copy-on-write fault each). Built here, before any checkpoint, the codecs
// are in every replica's memory already.
func warmCodecs() int {
	n := 0
	seen := map[protoreflect.FullName]bool{}
	var warm func(ms protoreflect.MessageDescriptors)
	warm = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			md := ms.Get(i)
			if seen[md.FullName()] || md.IsMapEntry() {
				continue
			}
			seen[md.FullName()] = true
			warm(md.Messages())
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
			if err != nil {
				continue
			}
			m := mt.New().Interface()
			// Size builds the type's codec; an empty decode, its decoder's.
			proto.Size(m)
			_ = proto.Unmarshal(nil, m)
			n++
		}
	}
	f := aciv1.File_forkfleet_aci_v1_aci_proto
	warm(f.Messages())
	for i := 0; i < f.Imports().Len(); i++ {
		warm(f.Imports().Get(i).Messages())
	}
	return n
}
