package main

import (
	"math"
	"os"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
)

// TestMemoryLimitFromContainer: the runtime's soft limit is 90% of the container's limit;
// without one it stays unlimited; GOMEMLIMIT in the environment wins over the container.
func TestMemoryLimitFromContainer(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	log := hclog.NewNullLogger()
	t.Setenv("GOMEMLIMIT", "")
	t.Setenv("AUTOMEMLIMIT", "") // restored after the test; unset during it
	require.NoError(t, os.Unsetenv("AUTOMEMLIMIT"))

	want := int64(450 << 20) // 90% of 500 MiB
	require.Equal(t, want, setMemoryLimit(log, memlimit.Limit(500<<20)))
	require.Equal(t, want, debug.SetMemoryLimit(-1))

	require.EqualValues(t, math.MaxInt64, setMemoryLimit(log, func() (uint64, error) { return 0, memlimit.ErrNoLimit }))
	require.EqualValues(t, math.MaxInt64, debug.SetMemoryLimit(-1))

	debug.SetMemoryLimit(300 << 20) // as the runtime does from GOMEMLIMIT=300MiB
	t.Setenv("GOMEMLIMIT", "300MiB")
	require.EqualValues(t, 300<<20, setMemoryLimit(log, memlimit.Limit(500<<20)))
	require.EqualValues(t, 300<<20, debug.SetMemoryLimit(-1))
}

// TestGCPercent: the controller's GOGC is gcPercent, unless the environment sets GOGC.
func TestGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	log := hclog.NewNullLogger()
	t.Setenv("GOGC", "")
	require.NoError(t, os.Unsetenv("GOGC"))
	setGCPercent(log)
	require.Equal(t, gcPercent, debug.SetGCPercent(100))

	t.Setenv("GOGC", "200") // the runtime read it at the start; this test's process set 100
	setGCPercent(log)
	require.Equal(t, 100, debug.SetGCPercent(100), "GOGC in the environment wins")
}
