package agent

import (
	"io"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"kuport.wlz.li/kuport/datapath"
	"kuport.wlz.li/kuport/datapath/datapathtest"
	"kuport.wlz.li/kuport/internal/syncbuf"
	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// BenchmarkPrivilegedAgentChange is one change at 10,000 mappings through the whole agent: a
// real controller stream over TLS, the agent's loop and a real datapath in a fresh namespace,
// as cmd/kuport-agent runs it (GOGC 25 but 100 in Apply, the garbage returned after each
// program, logs formatted at info). With the base program applied, each op sends the
// ProgramDelta that adds one mapping (or takes it away again) and waits for its Ack; ns/op
// and the ack-ms percentiles (of the adds and of the removes) are send to Ack. datapath's
// BenchmarkAgentChange times the steps.
// Run as root:
//
//	KUPORT_PRIVILEGED=1 go test -run '^$' -bench PrivilegedAgentChange -benchtime 20x ./agent/
func BenchmarkPrivilegedAgentChange(b *testing.B) {
	testenv.Privileged(b)
	const n = 10000
	version := programVersions(n + 1)
	log := hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Info})
	dp := benchDatapath(b, log, 0)
	defer debug.SetGCPercent(debug.SetGCPercent(steadyGCPercent))

	c, target := startController(b)
	cfg := testConfig(PacedApply(dp), &syncbuf.Buffer{}, target)
	cfg.Log, cfg.Underlay = log, "wt0"
	cfg.Validate, cfg.EntryErrors, cfg.Applied = dp.Validate, datapath.EntryErrors, FreeOSMemory
	startAgent(b, cfg)
	s := c.NextSession(b)
	cur := version(1, n)
	s.Send(b, cur)
	require.Empty(b, s.NextAck(b).GetErrors())

	// Send to Ack of the adds (even ops) and of the removes (odd ops).
	var acks [2][]time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		next := version(cur.GetVersion()+1, n+1-i%2)
		msg := &kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Delta{Delta: kuportv1.Delta(cur, next)}}
		b.StartTimer()
		start := time.Now()
		s.SendMessage(b, msg)
		ack := s.NextAck(b)
		acks[i%2] = append(acks[i%2], time.Since(start))
		b.StopTimer()
		require.Equal(b, next.GetVersion(), ack.GetVersion())
		require.Empty(b, ack.GetErrors())
		cur = next
		b.StartTimer()
	}
	for k, kind := range []string{"add", "remove"} {
		if len(acks[k]) == 0 {
			continue
		}
		slices.Sort(acks[k])
		at := func(q float64) float64 { return float64(acks[k][int(q*float64(len(acks[k])-1))].Microseconds()) / 1000 }
		b.ReportMetric(at(0.5), "ack-ms-p50/"+kind)
		b.ReportMetric(at(0.99), "ack-ms-p99/"+kind)
	}
}

// BenchmarkPrivilegedAgentBulkDelete is a thousand mappings deleted at once through the whole
// agent, as the lab's bulk reaches it: from the program of 1,000, each op sends 40 deltas of
// 25 mappings fewer, each after the last one's Ack, to none. Without a SweepDelay every
// program's Apply reads the conntrack table; with the agent's, the sweeps of the programs
// within it are one. ns/op is the 40 deltas' time to their last Ack.
// Run as root:
//
//	KUPORT_PRIVILEGED=1 go test -run '^$' -bench PrivilegedAgentBulkDelete -benchtime 5x ./agent/
func BenchmarkPrivilegedAgentBulkDelete(b *testing.B) {
	testenv.Privileged(b)
	const n, step = 1000, 25
	version := programVersions(n)
	for _, delay := range []time.Duration{0, SweepDelay} {
		b.Run("sweep-delay="+delay.String(), func(b *testing.B) {
			log := hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Info})
			dp := benchDatapath(b, log, delay)
			b.Cleanup(dp.SweepNow)
			defer debug.SetGCPercent(debug.SetGCPercent(steadyGCPercent))

			c, target := startController(b)
			cfg := testConfig(PacedApply(dp), &syncbuf.Buffer{}, target)
			cfg.Log, cfg.Underlay = log, "wt0"
			cfg.Validate, cfg.EntryErrors, cfg.Applied = dp.Validate, datapath.EntryErrors, FreeOSMemory
			startAgent(b, cfg)
			s := c.NextSession(b)
			var v uint64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				v++
				cur := version(v, n)
				s.Send(b, cur)
				require.Empty(b, s.NextAck(b).GetErrors())
				b.StartTimer()
				for m := n - step; m >= 0; m -= step {
					v++
					next := version(v, m)
					s.SendMessage(b, &kuportv1.ConnectResponse{Message: &kuportv1.ConnectResponse_Delta{Delta: kuportv1.Delta(cur, next)}})
					require.Empty(b, s.NextAck(b).GetErrors())
					cur = next
				}
			}
		})
	}
}

// programVersions returns the program of the first m of n benchmark mappings at version v.
func programVersions(n int) func(v uint64, m int) *kuportv1.NodeProgram {
	full := datapathtest.Program(n, "wt0")
	return func(v uint64, m int) *kuportv1.NodeProgram {
		return &kuportv1.NodeProgram{Node: full.Node, Version: v, Epoch: full.Epoch, DnatRules: full.DnatRules[:m], SnatRules: full.SnatRules[:m]}
	}
}

// benchDatapath is a real datapath logging to log's "datapath", in a fresh namespace that
// goes when b ends, its conntrack sweeps put off by sweepDelay.
func benchDatapath(b *testing.B, log hclog.Logger, sweepDelay time.Duration) *datapath.Datapath {
	b.Helper()
	d := newDriftNS(b)
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(int(d.ns)), datapath.NFTSocketOption())
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.CloseLasting() })
	nl, err := netlink.NewHandleAt(d.ns)
	require.NoError(b, err)
	b.Cleanup(nl.Close)
	return datapath.New(datapath.Config{NFT: conn, Netlink: nl, NetNS: d.ns, Log: log.Named("datapath"), SweepDelay: sweepDelay})
}
