package compile

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// wellKnownNodePorts are ports a Kubernetes node's own processes listen on whatever the CNI:
// a mapping of one DNATs the node's own traffic on the class's interfaces away from it
// (kuport's prerouting rules run before the node's sockets see a packet).
var wellKnownNodePorts = []struct {
	first, last uint32
	what        string
}{
	{2379, 2380, "etcd"},
	{6443, 6443, "kube-apiserver"},
	{10250, 10250, "kubelet"},
}

// nodePortsCondition is the class's NodePortsReserved condition: False, naming the ports,
// when its window holds a well-known node port (wellKnownNodePorts, its own link port, the
// UDP port of a tunnel device an accepting node's agent reports) that spec.ports.reserved
// lacks. It only warns: what the class accepts does not change.
func (c *compiler) nodePortsCondition(ci *classInfo) metav1.Condition {
	window := fmt.Sprintf("%d-%d", ci.portMin, ci.portMax)
	unreserved := c.unreservedNodePorts(ci)
	ok := len(unreserved) == 0
	reason := v1alpha1.ReasonAllReserved
	msg := "the port window " + window + " holds no well-known node port outside reserved"
	if !ok {
		reason = v1alpha1.ReasonNodePortsUnreserved
		msg = fmt.Sprintf("ports %s are in the port window %s and not reserved: a mapping of one takes it over "+
			"from the node's own listener on the class's interfaces; add them to spec.ports.reserved",
			strings.Join(unreserved, ", "), window)
	}
	return c.condition(ci.obj.Status.Conditions, v1alpha1.ClassConditionNodePortsReserved, ok, reason, msg, ci.obj.Generation)
}

// unreservedNodePorts lists the well-known node ports inside the class's window that it does
// not reserve, "2379-2380 (etcd)", sorted by port, consecutive ports of one listener joined.
func (c *compiler) unreservedNodePorts(ci *classInfo) []string {
	what := map[uint32]string{}
	for _, p := range wellKnownNodePorts {
		for port := p.first; port <= p.last; port++ {
			what[port] = p.what
		}
	}
	if ci.mode == v1alpha1.ReturnPathVxlan {
		what[ci.port] = "the class's link port"
	}
	// A tunnel device's port, named by its devices on the first node by name that has it.
	nodesOn := map[uint32][]string{}
	for _, n := range ci.accepting {
		for port := range c.node(n).tunnels {
			nodesOn[port] = append(nodesOn[port], n)
		}
	}
	for port, nodes := range nodesOn {
		if _, known := what[port]; known {
			continue
		}
		w := c.node(nodes[0]).tunnels[port] + " on " + nodes[0]
		if len(nodes) > 1 {
			w += fmt.Sprintf(" and %d other nodes", len(nodes)-1)
		}
		what[port] = w
	}
	reserved := map[uint32]bool{}
	for _, r := range ci.obj.Spec.Ports.Reserved {
		if r > 0 {
			reserved[uint32(r)] = true
		}
	}
	ports := slices.Sorted(maps.Keys(what))
	ports = slices.DeleteFunc(ports, func(p uint32) bool {
		return p < uint32(max(ci.portMin, 0)) || p > uint32(max(ci.portMax, 0)) || reserved[p]
	})
	var out []string
	for i := 0; i < len(ports); {
		j := i
		for j+1 < len(ports) && ports[j+1] == ports[j]+1 && what[ports[j+1]] == what[ports[i]] {
			j++
		}
		span := fmt.Sprint(ports[i])
		if j > i {
			span += fmt.Sprintf("-%d", ports[j])
		}
		out = append(out, fmt.Sprintf("%s (%s)", span, what[ports[i]]))
		i = j + 1
	}
	return out
}
