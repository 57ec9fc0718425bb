package datapath

import (
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/datapath/datapathtest"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// pausedCounts is a Datapath's counterSocket whose second set read waits until release is
// closed (closing reading as it starts); it counts the set reads.
type pausedCounts struct {
	ownSockets
	reads            atomic.Int32
	reading, release chan struct{}
}

func (p *pausedCounts) setCounters(fam nftables.TableFamily, table, set string, fn func(key []byte, packets, bytes uint64)) error {
	if p.reads.Add(1) == 2 {
		close(p.reading)
		<-p.release
	}
	return p.ownSockets.setCounters(fam, table, set, fn)
}

// TestPrivilegedCountersBesideApply: an Apply is not held up by Counters reading the kernel's
// elements (the agent's report, about 100 ms at 10,000 mappings), and a Counters whose reads
// an Apply's compile overtook reads them again, so each element counts under the entry of
// the table it was read beside: its answer is what a Counters after the Apply gives.
func TestPrivilegedCountersBesideApply(t *testing.T) {
	if os.Getenv("KUPORT_PRIVILEGED") != "1" {
		t.Skip("needs root (network namespaces, nftables): set KUPORT_PRIVILEGED=1")
	}
	tn := newTestNS(t, "100.64.93.143")
	both := datapathtest.Program(2, "enp1s0")
	one := &kuportv1.NodeProgram{Node: both.Node, Version: 1, Epoch: both.Epoch, DnatRules: both.DnatRules[:1], SnatRules: both.SnatRules[:1]}
	require.NoError(t, tn.dp.Apply(one))
	paused := &pausedCounts{ownSockets: tn.dp.counterSocket, reading: make(chan struct{}), release: make(chan struct{})}
	tn.dp.counterSocket = paused
	type answer struct {
		counters []*kuportv1.Counter
		err      error
	}
	done := make(chan answer, 1)
	go func() {
		c, err := tn.dp.Counters()
		done <- answer{c, err}
	}()
	select {
	case <-paused.reading:
	case <-time.After(10 * time.Second):
		t.Fatal("Counters read no second set")
	}
	applied := make(chan error, 1)
	go func() { applied <- tn.dp.Apply(both) }()
	select {
	case err := <-applied:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		close(paused.release)
		t.Fatal("Apply waited for Counters' reads")
	}
	close(paused.release)
	a := <-done
	require.NoError(t, a.err)
	reads := int(paused.reads.Load())
	after, err := tn.dp.Counters()
	require.NoError(t, err)
	require.Equal(t, len(after), len(a.counters))
	for i := range after {
		require.True(t, proto.Equal(after[i], a.counters[i]), "counter %d: %v, after the Apply %v", i, a.counters[i], after[i])
	}
	require.Equal(t, 2*(int(paused.reads.Load())-reads), reads, "read again after the Apply")
	require.Len(t, after, 4, "both mappings' DNAT and SNAT entries")
}
