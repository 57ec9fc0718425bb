package compile

import (
	"testing"
)

// TestStandIn: a DNAT entry's stand-in (kup-steer's rewrite ahead of a host firewall, whose
// element also counts the entry's requests) is its target, a local pod or the far end of a
// link, also when the target is an address of the node itself (a pod sharing the node's
// network namespace): the firewall then judges the request as the node's own traffic, which
// it is.
func TestStandIn(t *testing.T) {
	s := world(mkPortMap("local", 0, 3000), mkPortMap("remote", 1, 3001, service("remote")),
		mkPortMap("host", 2, 3002, service("host")))
	addService(s, "host", 3002, mkEndpoint("host-0", "100.64.93.143", "edge-a"))
	r := Compile(s)
	want := map[string]string{
		"demo/local/dnat/enp1s0":  "10.244.17.7",
		"demo/remote/dnat/enp1s0": "169.254.77.1",
		"demo/host/dnat/enp1s0":   "100.64.93.143",
		"demo/host/dnat/wt0":      "100.64.93.143",
	}
	got := map[string]string{}
	for _, d := range r.Programs["edge-a"].DnatRules {
		got[d.Id] = d.StandIn
	}
	for id, w := range want {
		if g, ok := got[id]; !ok || g != w {
			t.Errorf("%s: stand-in %q (present %v), want %q", id, g, ok, w)
		}
	}
	if len(r.Programs["worker-b"].DnatRules) == 0 {
		t.Fatal("worker-b has no DNAT entry")
	}
	for _, d := range r.Programs["worker-b"].DnatRules {
		if d.StandIn != d.ToAddress {
			t.Errorf("%s on worker-b: stand-in %q, want its pod %s", d.Id, d.StandIn, d.ToAddress)
		}
	}
}
