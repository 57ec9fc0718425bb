package datapath

import (
	"slices"

	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// SameProgram reports whether x and y are the same program to the datapath: equal in every
// field but version and epoch (unknown fields, which compile ignores, aside). Entries are
// compared field by field in place, as the incremental plan compares them
// (TestSameCoversEveryField); proto.Equal, which reflects, cost more than the change's own
// Apply (BENCHMARKS.md, "Datapath at 1, 1,000 and 10,000 mappings").
func SameProgram(x, y *kuportv1.NodeProgram) bool {
	return x.GetNode() == y.GetNode() &&
		slices.EqualFunc(x.GetDnatRules(), y.GetDnatRules(), sameDnat) &&
		slices.EqualFunc(x.GetSnatRules(), y.GetSnatRules(), sameSnat) &&
		slices.EqualFunc(x.GetMarkRules(), y.GetMarkRules(), sameMark) &&
		sameNet(x.GetLinks(), x.GetReturnPaths(), x.GetReturnMarking(), y)
}

// sameNet reports whether links, returns and marking are p's links, return paths and return
// marking (whose prefs, tables and mask the return paths' rules and routes take).
func sameNet(links []*kuportv1.Link, returns []*kuportv1.ReturnPath, marking *kuportv1.ReturnMarking, p *kuportv1.NodeProgram) bool {
	return equalMsgs(links, p.GetLinks()) && equalMsgs(returns, p.GetReturnPaths()) && proto.Equal(marking, p.GetReturnMarking())
}

func equalMsgs[T proto.Message](a, b []T) bool {
	return slices.EqualFunc(a, b, func(x, y T) bool { return proto.Equal(x, y) })
}
