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
