// Package datapathtest builds the programs the datapath's and the agent's benchmarks, and
// bench/datapath, apply: one builder, so their figures are of the same program.
package datapathtest

import (
	"fmt"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// Program is edge-a's program for n same-node TCP mappings arriving on iface: ports 10000
// up, each to its own pod address (PodAddr), a DNAT entry steered to its pod address (as the
// compiler emits it: its translation, its steering, which counts its requests, and its reply
// counting) and the request's identity SNAT per mapping, 4n set elements.
func Program(n int, iface string) *kuportv1.NodeProgram {
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 1, Epoch: 1,
		DnatRules: make([]*kuportv1.DnatRule, 0, n), SnatRules: make([]*kuportv1.SnatRule, 0, n)}
	for i := range n {
		key, pod, port := fmt.Sprintf("bench/m%05d", i), PodAddr(i), uint32(10000+i)
		ports := &kuportv1.PortRange{First: port, Last: port}
		p.DnatRules = append(p.DnatRules, &kuportv1.DnatRule{Id: key + "/dnat/" + iface, Mapping: key, InInterface: iface,
			Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: ports, ToAddress: pod, ToPort: port, StandIn: pod})
		p.SnatRules = append(p.SnatRules, &kuportv1.SnatRule{Id: key + "/snat", Mapping: key, Kind: kuportv1.SnatKind_SNAT_KIND_REQUEST,
			Address: pod, Protocol: kuportv1.Protocol_PROTOCOL_TCP, Ports: ports})
	}
	return p
}

// PodAddr is mapping i's pod address in Program: 10.244.17.2 up, 250 a /24.
func PodAddr(i int) string { return fmt.Sprintf("10.244.%d.%d", 17+i/250, 2+i%250) }
