package datapath

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"kuport.wlz.li/kuport/datapath/datapathtest"
	"kuport.wlz.li/kuport/internal/testenv"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// pausedCounts is a Datapath's counterSocket whose second set read, closing reading as it
// starts, waits for its yield to say so and gives way; it counts the set reads.
type pausedCounts struct {
	ownSockets
	reads   atomic.Int32
	reading chan struct{}
}

func (p *pausedCounts) setCounters(fam nftables.TableFamily, table, set string, fn func(key []byte, packets, bytes uint64), yield func() bool) error {
	if p.reads.Add(1) == 2 {
		close(p.reading)
		for deadline := time.Now().Add(20 * time.Second); !yield(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return errors.New("nothing waited for the element reads")
			}
		}
		return errYielded
	}
	return p.ownSockets.setCounters(fam, table, set, fn, yield)
}

// TestPrivilegedCountersBesideApply: an Apply is not held up by Counters reading the kernel's
// elements (the agent's report, about 100 ms at 10,000 mappings): the reads give way to it
// and start over after it, so each element counts under the entry of the table it was read
// beside: Counters' answer is what a Counters after the Apply gives.
func TestPrivilegedCountersBesideApply(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	both := datapathtest.Program(2, "enp1s0")
	one := &kuportv1.NodeProgram{Node: both.Node, Version: 1, Epoch: both.Epoch, DnatRules: both.DnatRules[:1], SnatRules: both.SnatRules[:1]}
	require.NoError(t, tn.dp.Apply(one))
	paused := &pausedCounts{ownSockets: tn.dp.counterSocket, reading: make(chan struct{})}
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
	case <-time.After(5 * time.Second):
		t.Fatal("Apply waited for Counters' reads")
	}
	a := <-done
	require.NoError(t, a.err)
	reads := int(paused.reads.Load())
	after, err := tn.dp.Counters()
	require.NoError(t, err)
	require.Equal(t, len(after), len(a.counters))
	for i := range after {
		require.True(t, proto.Equal(after[i], a.counters[i]), "counter %d: %v, after the Apply %v", i, a.counters[i], after[i])
	}
	require.Equal(t, 2+int(paused.reads.Load())-reads, reads, "read again after the Apply")
	require.Len(t, after, 4, "both mappings' DNAT and SNAT entries")
}

// TestPrivilegedElementReadGivesWay: an element read its yield stops returns errYielded
// part way through the set, and the next read on the socket (the dump's rest drained) gives
// the whole set again.
func TestPrivilegedElementReadGivesWay(t *testing.T) {
	testenv.Privileged(t)
	tn := newTestNS(t, "100.64.93.143")
	const n = 3000
	require.NoError(t, tn.dp.Apply(datapathtest.Program(n, "enp1s0")))
	read := func(yield func() bool) (int, error) {
		count := 0
		err := tn.dp.counterSocket.setCounters(tableFamily, tableName, "dnat-ports",
			func([]byte, uint64, uint64) { count++ }, yield)
		return count, err
	}
	never := func() bool { return false }
	whole, err := read(never)
	require.NoError(t, err)
	require.Equal(t, n, whole)

	part, err := read(func() bool { return true })
	require.ErrorIs(t, err, errYielded)
	require.Positive(t, part)
	require.Less(t, part, n, "the dump stopped part way")

	again, err := read(never)
	require.NoError(t, err)
	require.Equal(t, n, again)

	_, err = read(func() bool { return true })
	require.ErrorIs(t, err, errYielded)
	counters, err := tn.dp.Counters()
	require.NoError(t, err)
	require.Len(t, counters, 2*n, "every mapping's DNAT and SNAT entries")
}
