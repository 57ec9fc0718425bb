package dashboard

import (
	"math"
	"math/rand/v2"
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

// TestHistoryFlatEqualsRing: series kept flat (every value unknown or 0) read the same as rings, over
// random records (same slot again, gaps, gaps past the whole history, series dropped and
// back, values unknown, 0 and not): the reference keeps every value by its slot.
func TestHistoryFlatEqualsRing(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	var h history
	keys := []string{"a", "b", "c", "d"}
	ref := map[string]map[int64]float32{} // key: slot number: value
	now := time.Unix(1_800_000_000, 0)
	flat := 0
	for step := range 3000 {
		switch r := rng.IntN(100); {
		case r < 10: // the same slot again
			now = now.Add(time.Duration(rng.IntN(int(historyStep) / 2)))
		case r < 11:
			now = now.Add(time.Duration(historyLen+rng.IntN(5)) * historyStep)
		case r < 14:
			now = now.Add(time.Duration(2+rng.IntN(10)) * historyStep)
		default:
			now = now.Add(historyStep)
		}
		slot := now.Truncate(historyStep).Unix() / int64(historyStep/time.Second)
		values := map[string]float64{}
		for _, k := range keys {
			if rng.IntN(50) == 0 {
				delete(ref, k) // absent: dropped
				continue
			}
			v := 0.0
			switch r := rng.IntN(200); {
			case k >= "c": // c and d idle: 0, rarely unknown (a counter reset)
				if r == 0 {
					v = math.NaN()
				}
			case r < 20:
				v = math.NaN()
			case r < 40:
				v = float64(rng.IntN(100))
			}
			values[k] = v
			if ref[k] == nil {
				ref[k] = map[int64]float32{}
			}
			ref[k][slot] = float32(v)
		}
		h.record(values, now)
		got, end := h.get(keys...)
		require.Equal(t, now.Truncate(historyStep), end)
		for i, k := range keys {
			if ref[k] == nil {
				require.Nil(t, got[i], "step %d key %s", step, k)
				continue
			}
			want := make(Series, historyLen)
			for j := range want {
				v, ok := ref[k][slot-historyLen+1+int64(j)]
				want[j] = float32(math.NaN())
				if ok {
					want[j] = v
				}
			}
			wantJSON, err := want.MarshalJSON()
			require.NoError(t, err)
			gotJSON, err := got[i].MarshalJSON()
			require.NoError(t, err)
			require.Equal(t, string(wantJSON), string(gotJSON), "step %d key %s", step, k)
		}
		for _, s := range h.series {
			if s.ring == nil {
				flat++
			}
		}
	}
	assert.Greater(t, flat, 2000, "idle series stayed flat")
}
