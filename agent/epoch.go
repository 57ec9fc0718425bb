package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The fencing floor (program.proto, NodeProgram.epoch) must outlive the agent process: an
// agent restarted while a deposed leader is still reachable would otherwise take that
// leader's stale program. It is kept in Config.EpochFile, on a tmpfs such as /run, so a
// reboot, which empties the kernel state it fences, empties it too.

// loadEpoch reads the highest epoch an agent on this node applied from path: 0 when path is
// "" or the file does not exist. Errors: the file cannot be read or does not hold a decimal
// epoch.
func loadEpoch(path string) (uint64, error) {
	if path == "" {
		return 0, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("agent: epoch file: %w", err)
	}
	e, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("agent: epoch file %s: %w", path, err)
	}
	return e, nil
}

// storeEpoch writes epoch to path atomically (a temporary file renamed over it), creating
// the directory. Errors: the directory or file cannot be written.
func storeEpoch(path string, epoch uint64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("agent: epoch file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".epoch-*")
	if err != nil {
		return fmt.Errorf("agent: epoch file: %w", err)
	}
	_, werr := fmt.Fprintln(tmp, epoch)
	if err := errors.Join(werr, tmp.Close()); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("agent: epoch file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("agent: epoch file: %w", err)
	}
	return nil
}

// raiseEpochFloor records that a program of epoch was applied: the floor rises and, past
// the stored one, is written to Config.EpochFile. A write failure is logged: fencing still
// holds for this process's life.
func (a *Agent) raiseEpochFloor(epoch uint64) {
	if epoch <= a.epochFloor {
		return
	}
	a.epochFloor = epoch
	if a.cfg.EpochFile == "" {
		return
	}
	if err := storeEpoch(a.cfg.EpochFile, epoch); err != nil {
		a.log.Error("cannot keep the fencing epoch across restarts", "epoch", epoch, "error", err)
	}
}
