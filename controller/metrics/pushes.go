package metrics

import (
	"sync"
	"time"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// PushTracker measures kuport_program_push_to_ack_seconds from successive views of the
// agent registry's nodes: it notes when each node's program version first appears and, once
// the node's acknowledged version reaches it, observes the time in between. A version an
// agent skips (a later one superseded it before it was sent) is observed when the later one
// is acknowledged, since that is when its content reached the kernel. The zero value is
// ready; safe for concurrent use.
type PushTracker struct {
	mu    sync.Mutex
	nodes map[string]*pushes
}

// pushes is one node's program versions stored and not yet acknowledged.
type pushes struct {
	latest  uint64
	pending []storedVersion // ascending versions
}

type storedVersion struct {
	version uint64
	at      time.Time
}

// Observe takes the registry's nodes (agents.Registry.Nodes) at now. Call it right after
// storing programs (so a new version's time is the store's) and after every agent event but
// an acknowledgement, which Acked takes in O(1) (so its time is its arrival's; a thousand
// acks each listing a thousand nodes allocated a million NodeInfos at once). A node whose program version went down (a
// new leadership term's registry numbers from 1 again) starts over; nodes no longer listed
// are forgotten.
func (t *PushTracker) Observe(nodes []*kuportv1.NodeInfo, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := make(map[string]*pushes, len(nodes))
	for _, n := range nodes {
		p := t.nodes[n.Node]
		if p == nil || n.ProgramVersion < p.latest {
			p = &pushes{}
		}
		if n.ProgramVersion > p.latest {
			p.latest = n.ProgramVersion
			p.pending = append(p.pending, storedVersion{version: n.ProgramVersion, at: now})
		}
		done := 0
		for _, s := range p.pending {
			if s.version > n.AckedVersion {
				break
			}
			pushToAckSeconds.Observe(now.Sub(s.at).Seconds())
			done++
		}
		p.pending = p.pending[done:]
		seen[n.Node] = p
	}
	t.nodes = seen
}

// Acked takes node's acknowledgement of version at now: the versions stored up to it are
// observed.
func (t *PushTracker) Acked(node string, version uint64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.nodes[node]
	if p == nil {
		return
	}
	done := 0
	for _, s := range p.pending {
		if s.version > version {
			break
		}
		pushToAckSeconds.Observe(now.Sub(s.at).Seconds())
		done++
	}
	p.pending = p.pending[done:]
}
