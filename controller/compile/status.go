package compile

import (
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// condition builds a condition as meta.SetStatusCondition would leave it: its
// LastTransitionTime is the snapshot's time, or the previous one when the status is unchanged.
func (c *compiler) condition(old []metav1.Condition, typ string, ok bool, reason, msg string, gen int64) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	cond := metav1.Condition{Type: typ, Status: status, ObservedGeneration: gen,
		LastTransitionTime: c.stamp, Reason: reason, Message: msg}
	if prev := meta.FindStatusCondition(old, typ); prev != nil && prev.Status == status {
		cond.LastTransitionTime = prev.LastTransitionTime
	}
	return cond
}

// portMapResult is the status to write for a mapping and the nodes carrying it.
func (c *compiler) portMapResult(p *plan) *PortMapResult {
	pm := p.pm
	st := v1alpha1.PortMapStatus{ObservedGeneration: pm.Generation, Ports: p.ports.String(), Published: p.published}
	var addrs []string
	for _, a := range p.published {
		if a.Address != "" {
			addrs = append(addrs, a.Address)
		}
	}
	st.PublishedAddresses = strings.Join(addrs, ",")
	if p.ep != nil {
		st.Endpoint = &v1alpha1.EndpointStatus{Node: p.ep.node, Address: p.ep.address}
	}
	progReason, progMsg := p.progReason, p.progMsg
	switch {
	case !p.accepted():
		progReason, progMsg = v1alpha1.ReasonNotAccepted, "the mapping is not accepted: "+p.acceptReason
	case progReason == "":
		progReason, progMsg = v1alpha1.ReasonAllNodesReady, c.intern("rules compiled for nodes "+strings.Join(p.nodes, ", "))
	}
	st.Conditions = []metav1.Condition{
		c.condition(pm.Status.Conditions, v1alpha1.ConditionAccepted, p.accepted(), p.acceptReason, p.acceptMsg, pm.Generation),
		c.condition(pm.Status.Conditions, v1alpha1.ConditionProgrammed, progReason == v1alpha1.ReasonAllNodesReady,
			progReason, progMsg, pm.Generation),
	}
	return &PortMapResult{Status: st, Nodes: p.nodes}
}
