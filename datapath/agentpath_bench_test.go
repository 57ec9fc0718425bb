package datapath

import (
	"runtime/debug"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/datapath/datapathtest"
	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// BenchmarkAgentChange is the agent's path for one change at 10,000 mappings: with the base
// program applied, the ProgramDelta that adds one mapping (then the one that takes it away
// again) arrives on the wire and goes through what the agent does with it, each step timed
// (reported per add and per remove): "unmarshal" the ConnectResponse (the stream's Recv),
// "delta" its Apply onto the base (agent.session), "validate" Datapath.Validate, "same"
// SameProgram with the current program, "apply" Datapath.Apply (agent.handleProgram), of
// which "apply-in-kernel" until the kernel held the program (before the conntrack sweep).
// The agent's pace of collection is kept: GOGC 25 outside Apply, 100 in it
// (agent.SetSteadyPace, agent.PacedApply). The mappings go to a pod each ("pods"), or all to
// one pod port ("one-pod-port", as bench/control's to one Service: they share its identity
// SNAT element). Run as root:
//
//	KUPORT_PRIVILEGED=1 go test -run '^$' -bench AgentChange -benchtime 20x ./datapath/
func BenchmarkAgentChange(b *testing.B) {
	testenv.Privileged(b)
	const n = 10000
	b.Run("pods", func(b *testing.B) { benchAgentChange(b, datapathtest.Program(n+1, "enp1s0"), 4) })
	onePort := datapathtest.Program(n+1, "enp1s0")
	for i := range onePort.DnatRules {
		d, s := onePort.DnatRules[i], onePort.SnatRules[i]
		d.ToAddress, d.StandIn, d.ToPort = "10.244.17.2", "10.244.17.2", 8080
		s.Address, s.Ports = "10.244.17.2", &kuportv1.PortRange{First: 8080, Last: 8080}
	}
	b.Run("one-pod-port", func(b *testing.B) { benchAgentChange(b, onePort, 3) })
}

// benchAgentChange is BenchmarkAgentChange's steps, full being the base program with one
// more mapping, which writes that many elements.
func benchAgentChange(b *testing.B, full *kuportv1.NodeProgram, writes int) {
	n := len(full.DnatRules) - 1
	without := &kuportv1.NodeProgram{Node: full.Node, Epoch: full.Epoch,
		DnatRules: full.DnatRules[:n], SnatRules: full.SnatRules[:n]}
	tn := newTestNS(b, "100.64.93.143")
	tn.dp.log = hclog.NewNullLogger()
	defer debug.SetGCPercent(debug.SetGCPercent(25))
	// The controller's programs share their unchanged entries, as the agent's do.
	cur := &kuportv1.NodeProgram{Node: without.Node, Version: 1, Epoch: without.Epoch, DnatRules: without.DnatRules, SnatRules: without.SnatRules}
	require.NoError(b, tn.dp.Validate(cur))
	require.NoError(b, tn.dp.Apply(cur))
	// The steps' times of the adds (even ops) and of the removes (odd ops).
	var steps [2][6]time.Duration
	wire := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		// The controller's side: the next version, one mapping added or removed.
		target := full
		if i%2 == 1 {
			target = without
		}
		next := &kuportv1.NodeProgram{Node: target.Node, Version: cur.Version + 1, Epoch: target.Epoch,
			DnatRules: target.DnatRules, SnatRules: target.SnatRules}
		msg, err := proto.Marshal(&kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Delta{Delta: kuportv1.Delta(cur, next)}})
		require.NoError(b, err)
		wire += len(msg)
		b.StartTimer()

		t0 := time.Now()
		resp := &kuportv1.ConnectResponse{}
		require.NoError(b, proto.Unmarshal(msg, resp))
		t1 := time.Now()
		p, err := resp.GetDelta().Apply(cur)
		require.NoError(b, err)
		t2 := time.Now()
		require.NoError(b, tn.dp.Validate(p))
		t3 := time.Now()
		require.False(b, SameProgram(p, cur))
		t4 := time.Now()
		old := debug.SetGCPercent(100)
		require.NoError(b, tn.dp.Apply(p))
		debug.SetGCPercent(old)
		t5 := time.Now()
		require.Equal(b, writes, tn.dp.lastChanges, "one mapping's elements: its translation, its steering, its reply counting and its identity SNAT (unless shared)")
		cur = p
		for n, d := range []time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t5.Sub(t4), tn.dp.lastInKernel} {
			steps[i%2][n] += d
		}
	}
	for k, kind := range []string{"add", "remove"} {
		ops := (b.N + 1 - k) / 2
		if ops == 0 {
			continue
		}
		for n, step := range []string{"unmarshal", "delta", "validate", "same", "apply", "apply-in-kernel"} {
			b.ReportMetric(float64(steps[k][n].Microseconds())/float64(ops), step+"-µs/"+kind)
		}
	}
	b.ReportMetric(float64(wire)/float64(b.N), "wire-B/op")
}
