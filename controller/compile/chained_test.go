package compile_test

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/agent"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/servingcert"
	"kuport.wlz.li/kuport/datapath"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

var (
	chainedSeed  = flag.Uint64("chained.seed", 0, "TestChainedIncremental: the first seed")
	chainedSeeds = flag.Int("chained.seeds", 2, "TestChainedIncremental: how many seeds from -chained.seed")
	chainedSteps = flag.Int("chained.steps", 200, "TestChainedIncremental: steps per seed")
)

// chainedNodes are the nodes of the events' world, with each agent's underlay address.
var chainedNodes = map[string]string{"edge-a": "100.64.93.143", "worker-b": "100.64.93.150", "worker-c": "100.64.93.160"}

// TestChainedIncremental chains the four incremental layers as the product runs them: the
// events of TestIncrementalEqualsFull compiled by compile.Incremental from the Changes the
// informers would tell, the registry versioning each node's program, the real gRPC stream
// carrying deltas to a real agent per node, and the agent's long-lived Datapath applying
// each program incrementally to an in-memory kernel (datapath.NewFake). After every step,
// once every agent acknowledged its node's program, each node's kernel must hold exactly
// what a fresh kernel holds after one Apply of a full compile's program: any layer that
// drops or keeps a change its full path would not shows as a difference. Every layer's
// incremental path must also have been taken (recompiles of a few mappings, deltas on
// streams that never reconnect, the agents' datapaths never rebuilt).
func TestChainedIncremental(t *testing.T) {
	for seed := *chainedSeed; seed < *chainedSeed+uint64(*chainedSeeds); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { chain(t, seed, *chainedSteps) })
	}
}

func chain(t *testing.T, seed uint64, steps int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	acked := make(chan struct{}, 1)
	// Each agent connects once: a delta that does not apply ends its stream, and the next
	// brings the whole program, which would hide a broken delta.
	var connects atomic.Int32
	reg := agents.NewRegistry(agents.Config{Epoch: 1, Start: time.Now(),
		OnAck: func(string, uint64) {
			select {
			case acked <- struct{}{}:
			default:
			}
		},
		OnAgent: func(_ string, connected bool, _ string) {
			if connected {
				connects.Add(1)
			}
		}})
	target, caFile := serveRegistry(t, reg)

	kernels := map[string]*chainedKernel{}
	var running sync.WaitGroup
	for node, underlay := range chainedNodes {
		dp, dump := datapath.NewFake(underlay, nil)
		k := &chainedKernel{Datapath: dp, dump: dump, underlay: underlay}
		kernels[node] = k
		a, err := agent.New(agent.Config{NodeName: node, Underlay: "wt0", Targets: []string{target}, CAFile: caFile,
			ServerName: chainedServerName, Datapath: k, EntryErrors: datapath.EntryErrors, Validate: dp.Validate,
			ReportInterval: time.Hour, StatePollInterval: time.Hour, ResyncInterval: time.Hour})
		require.NoError(t, err)
		running.Go(func() { _ = a.Run(ctx) })
	}
	defer running.Wait()
	defer cancel()

	e := compile.NewEvents(seed)
	var inc compile.Incremental
	partial, changes := 0, 0
	for step := range steps {
		s, ch, what := e.Next()
		res := inc.CompileChanges(s, ch)
		if inc.Recompiled() < len(s.PortMaps) {
			partial++
		}
		changes += len(reg.SetPrograms(res.Programs, res.Index))
		if step == 0 {
			reg.Release(nil, time.Now())
		}
		waitAcked(t, reg, acked, &connects, step, what)

		full := compile.Compile(s)
		for node, k := range kernels {
			want := full.Programs[node]
			if want == nil {
				want = &kuportv1.NodeProgram{Node: node}
			}
			fresh, dump := datapath.NewFake(k.underlay, nil)
			require.NoError(t, fresh.Apply(want), "step %d (%s): %s from scratch", step, what, node)
			wantDump, err := dump()
			require.NoError(t, err)
			gotDump, err := k.dump()
			require.NoError(t, err)
			require.NoError(t, k.lastErr(), "step %d (%s): %s's agent applied with errors", step, what, node)
			require.Equal(t, wantDump, gotDump, "step %d (%s): %s's kernel after the chain (+) differs from a fresh apply of a full compile (-)", step, what, node)
		}
	}
	t.Logf("%d steps: %d compiled a few mappings, %d node programs changed", steps, partial, changes)
	assert.Greater(t, partial, steps/3, "compiles of a few mappings")
	assert.Greater(t, changes, steps/2, "node programs changed")
}

// chainedKernel is one node's Datapath over its fake kernel, recording the last Apply's error.
type chainedKernel struct {
	*datapath.Datapath
	dump     func() (string, error)
	underlay string
	mu       sync.Mutex
	err      error
}

func (k *chainedKernel) Apply(p *kuportv1.NodeProgram) error {
	err := k.Datapath.Apply(p)
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
	return err
}

func (k *chainedKernel) lastErr() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// waitAcked waits until every node's agent acknowledged its current program, each on the
// one stream it opened (connects counts them).
func waitAcked(t *testing.T, reg *agents.Registry, acked <-chan struct{}, connects *atomic.Int32, step int, what string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if n := int(connects.Load()); n > len(chainedNodes) {
			t.Fatalf("step %d (%s): %d streams for %d agents: one reconnected (its delta did not apply?)", step, what, n, len(chainedNodes))
		}
		var behind []string
		for node := range chainedNodes {
			if p, v, _ := reg.Program(node); p == nil || v < p.Version {
				behind = append(behind, node)
			}
		}
		if len(behind) == 0 {
			return
		}
		select {
		case <-acked:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("step %d (%s): %v never acknowledged their programs", step, what, behind)
		}
	}
}

const chainedServerName = "kuport-controller.test"

// serveRegistry serves reg over TLS on a unix socket and returns the agents' target and the
// file of the CA they must trust.
func serveRegistry(t *testing.T, reg *agents.Registry) (target, caFile string) {
	t.Helper()
	b, err := servingcert.Generate([]string{chainedServerName}, time.Now())
	require.NoError(t, err)
	cert, err := b.Certificate()
	require.NoError(t, err)
	dir := t.TempDir()
	caFile = filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, b.CACert, 0o600))
	srv := agents.NewServer(nil, nil, &tls.Config{Certificates: []tls.Certificate{*cert}})
	srv.Lead(reg)
	target = "unix://" + filepath.Join(dir, "controller.sock")
	lis, err := agents.Listen(target)
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	return target, caFile
}
