package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/types"
)

func TestCompileDelay(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w := 50 * time.Millisecond
	assert.Equal(t, time.Duration(0), compileDelay(time.Time{}, t0, w), "first compile")
	assert.Equal(t, time.Duration(0), compileDelay(t0, t0.Add(time.Second), w), "after a quiet spell")
	assert.Equal(t, time.Duration(0), compileDelay(t0, t0.Add(w), w), "window just over")
	assert.Equal(t, 30*time.Millisecond, compileDelay(t0, t0.Add(20*time.Millisecond), w), "within the window")
}

func TestAckWaits(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, b := types.NamespacedName{Namespace: "n", Name: "a"}, types.NamespacedName{Namespace: "n", Name: "b"}
	var w ackWaits
	assert.Equal(t, time.Second, w.delay(a, t0, time.Second), "first wait: the whole grace")
	assert.Equal(t, 600*time.Millisecond, w.delay(a, t0.Add(400*time.Millisecond), time.Second), "counted from the first")
	assert.Equal(t, time.Second, w.delay(b, t0.Add(400*time.Millisecond), time.Second), "per PortMap")
	assert.Equal(t, time.Duration(0), w.delay(a, t0.Add(time.Second), time.Second), "grace over: written")
	assert.Equal(t, time.Duration(0), w.delay(a, t0.Add(2*time.Second), time.Second), "still waiting: written at once")
	assert.Equal(t, time.Duration(0), w.delay(a, t0.Add(3*time.Second), 0), "may not wait")
	assert.Equal(t, time.Second, w.delay(a, t0.Add(4*time.Second), time.Second), "a new wait starts over")
	w.forget(b)
	assert.Equal(t, time.Second, w.delay(b, t0.Add(5*time.Second), time.Second), "forgotten")
}
