package datapath

import (
	"fmt"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/datapath/datapathtest"
	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// retarget is p with mapping i's pod moved: one mapping changed.
func retarget(p *kuportv1.NodeProgram, i int, pod string) *kuportv1.NodeProgram {
	q := proto.Clone(p).(*kuportv1.NodeProgram)
	q.Version++
	q.DnatRules[i].ToAddress, q.DnatRules[i].StandIn, q.SnatRules[i].Address = pod, pod, pod
	return q
}

// BenchmarkApply measures Apply in a fresh namespace for programs of 10, 1,000 and 10,000
// mappings: "first" writes the whole program into an empty namespace (a node receiving its
// program), "again" re-applies it unchanged, which writes nothing (the agent's resync,
// every 30 s by default), "change" retargets one mapping back and forth (6 element writes
// each). Run as root:
//
//	KUPORT_PRIVILEGED=1 go test -run '^$' -bench Apply -benchtime 5x ./datapath/
func BenchmarkApply(b *testing.B) {
	testenv.Privileged(b)
	for _, n := range []int{10, 1000, 10000} {
		p := datapathtest.Program(n, "enp1s0")
		b.Run(fmt.Sprintf("first/mappings=%d", n), func(b *testing.B) {
			tn := newTestNS(b, "100.64.93.143")
			tn.dp.log = hclog.NewNullLogger()
			b.ReportAllocs()
			for range b.N {
				require.NoError(b, tn.dp.Apply(p))
				b.StopTimer()
				require.NoError(b, tn.dp.Apply(&kuportv1.NodeProgram{Node: "edge-a"}))
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("again/mappings=%d", n), func(b *testing.B) {
			tn := newTestNS(b, "100.64.93.143")
			tn.dp.log = hclog.NewNullLogger()
			require.NoError(b, tn.dp.Apply(p))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				require.NoError(b, tn.dp.Apply(p))
				require.Zero(b, tn.dp.lastChanges, "an unchanged program must write nothing")
			}
		})
		b.Run(fmt.Sprintf("change/mappings=%d", n), func(b *testing.B) {
			tn := newTestNS(b, "100.64.93.143")
			tn.dp.log = hclog.NewNullLogger()
			require.NoError(b, tn.dp.Apply(p))
			moved := []*kuportv1.NodeProgram{retarget(p, n-1, "10.244.200.1"), p}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				require.NoError(b, tn.dp.Apply(moved[i%2]))
				require.Equal(b, 6, tn.dp.lastChanges, "one mapping's elements: its translation, its steering and its identity SNAT, each deleted and added")
			}
		})
	}
}
