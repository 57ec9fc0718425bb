package syncbuf

import (
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentWriteAndRead is for the race detector: writes and reads at once, nothing lost.
func TestConcurrentWriteAndRead(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for range 100 {
				_, _ = fmt.Fprintf(&b, "%d", i)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := len(b.String()); got != 400 {
		t.Fatalf("%d bytes written, want 400", got)
	}
}
