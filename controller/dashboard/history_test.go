package dashboard

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHistory: the history keeps historyLen slots, unknown until recorded, drops a series
// whose key is gone and opens skipped slots as unknown.
func TestHistory(t *testing.T) {
	var h history
	t0 := time.Unix(1_800_000_000, 0)
	for i := range historyLen + 10 {
		h.record(map[string]float64{"a": float64(i)}, t0.Add(time.Duration(i)*historyStep))
	}
	got, end := h.get("a", "b")
	assert.Equal(t, t0.Add((historyLen+9)*historyStep), end)
	require.Len(t, got[0], historyLen)
	assert.Equal(t, float32(10), got[0][0], "the oldest kept")
	assert.Equal(t, float32(historyLen+9), got[0][historyLen-1], "the newest last")
	assert.Nil(t, got[1])

	h.record(map[string]float64{"a": 1, "b": 2}, end.Add(3*historyStep))
	got, _ = h.get("a", "b")
	assert.True(t, isNaN(got[0][historyLen-2]) && isNaN(got[0][historyLen-3]), "skipped slots are unknown")
	assert.True(t, isNaN(got[1][0]), "a new series is unknown before it began")
	assert.Equal(t, float32(2), got[1][historyLen-1])
	b, err := got[1][historyLen-3:].MarshalJSON()
	require.NoError(t, err)
	assert.Equal(t, "[null,null,2]", string(b))

	h.record(map[string]float64{"b": 3}, end.Add(4*historyStep))
	got, _ = h.get("a")
	assert.Nil(t, got[0], "a is gone")
}

func isNaN(f float32) bool { return f != f }
