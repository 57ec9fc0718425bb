package agent

import (
	"runtime/metrics"
	"testing"
)

// forcedCollections is the number of collections forced so far (debug.FreeOSMemory).
func forcedCollections() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

var sink []byte

// TestFreeOSMemoryOnlyAfterMuchAllocated: FreeOSMemory forces a collection after
// freeAfterBytes were allocated since its last, and none after less.
func TestFreeOSMemoryOnlyAfterMuchAllocated(t *testing.T) {
	for range 2 * freeAfterBytes / (1 << 20) {
		sink = make([]byte, 1<<20)
	}
	before := forcedCollections()
	FreeOSMemory()
	if got := forcedCollections() - before; got != 1 {
		t.Fatalf("after %d MiB allocated: %d forced collections, want 1", 2*freeAfterBytes>>20, got)
	}
	sink = make([]byte, 1<<20)
	FreeOSMemory()
	if got := forcedCollections() - before; got != 1 {
		t.Fatalf("after 1 MiB more: %d forced collections, want still 1", got)
	}
}
