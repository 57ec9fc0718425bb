package netlab

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/internal/testenv"
)

// Only one lab runs on a machine at a time: a second waits for the lock and gives up when
// its context ends, then gets it once the first releases it (docs/lab.md); clean-up
// runs only while no lab holds it.
func TestPrivilegedLabLockIsExclusive(t *testing.T) {
	testenv.Privileged(t)
	var logged bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logged})
	// The first may wait for a lab of another process; only the second's wait is counted.
	first, err := acquireLock(context.Background(), hclog.NewNullLogger())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = acquireLock(ctx, log)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "another lab holds")
	assert.Equal(t, 1, strings.Count(logged.String(), "waiting for another lab to finish"), "the wait is said once")
	// Clean-up (make lab-down) leaves a lab that holds the lock alone.
	ran := false
	require.ErrorIs(t, WhileFree(func() error { ran = true; return nil }), ErrLabRunning)
	assert.False(t, ran, "WhileFree ran while a lab held the lock")
	require.NoError(t, first.Close())
	require.NoError(t, WhileFree(func() error { ran = true; return nil }))
	assert.True(t, ran, "WhileFree did not run with the lock free")
	second, err := acquireLock(context.Background(), log)
	require.NoError(t, err)
	require.NoError(t, second.Close())
}
