package datapath

import (
	"slices"

	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// SameProgram reports whether x and y are the same program to the datapath: equal in every
// field but version and epoch (unknown fields, which compile ignores, aside). Entries are
// compared field by field in place, as the incremental compile compares them
// (TestSameCoversEveryField); proto.Equal, which reflects, cost 10-16 ms for the first half
// of a 10,000-mapping program on this machine, more than the change's own Apply.
func SameProgram(x, y *kuportv1.NodeProgram) bool {
	same := func(a, b proto.Message) bool { return proto.Equal(a, b) }
	return x.GetNode() == y.GetNode() &&
		slices.EqualFunc(x.GetDnatRules(), y.GetDnatRules(), sameDnat) &&
		slices.EqualFunc(x.GetSnatRules(), y.GetSnatRules(), sameSnat) &&
		slices.EqualFunc(x.GetMarkRules(), y.GetMarkRules(), sameMark) &&
		slices.EqualFunc(x.GetLinks(), y.GetLinks(), func(a, b *kuportv1.Link) bool { return same(a, b) }) &&
		slices.EqualFunc(x.GetReturnPaths(), y.GetReturnPaths(), func(a, b *kuportv1.ReturnPath) bool { return same(a, b) })
}
