package dashboard

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/controller/agents"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// erringAgents is fakeAgents whose edge-a link counts 3 more tx_errors every report, until
// stopped.
type erringAgents struct {
	*fakeAgents
	mu      sync.Mutex
	errors  uint64
	stopped bool
}

func (e *erringAgents) Stats(node string) ([]agents.Counter, []*kuportv1.LinkStats) {
	ctrs, links := e.fakeAgents.Stats(node)
	e.mu.Lock()
	defer e.mu.Unlock()
	if node == "edge-a" {
		if !e.stopped {
			e.errors += 3
		}
		for _, l := range links {
			l.TxErrors = e.errors
		}
	}
	return ctrs, links
}

// TestLinkErrorsProblem: a link whose tx_errors rise is counted and listed as a problem of
// its node, with the device and the rate; once they stop rising, it is not.
func TestLinkErrorsProblem(t *testing.T) {
	e := &erringAgents{fakeAgents: &fakeAgents{}}
	s := New()
	s.SetSource(labSource(e))
	t0 := time.Unix(1_800_000_000, 0)
	s.State(t0)
	for i := 1; i <= 3; i++ {
		s.sample(t0.Add(time.Duration(i) * time.Second))
	}
	st := s.State(t0.Add(3 * time.Second))
	assert.Equal(t, 1, st.Overview.LinksErrorsRising)
	var found *Problem
	for i, p := range st.Overview.Problems {
		if p.Kind == ProblemLinkTxErrors {
			found = &st.Overview.Problems[i]
		}
	}
	require.NotNil(t, found, "problems: %v", st.Overview.Problems)
	assert.Equal(t, "edge-a", found.Node)
	assert.Equal(t, "kup-5e30a797", found.Link)
	assert.Contains(t, found.Message, "rising 3.0/s")

	e.mu.Lock()
	e.stopped = true // the errors stay where they are
	e.mu.Unlock()
	for i := 4; i <= 4+int(rateWindow.Seconds())+1; i++ {
		s.sample(t0.Add(time.Duration(i) * time.Second))
	}
	assert.Equal(t, 0, s.State(t0.Add(40*time.Second)).Overview.LinksErrorsRising)
}
