package compile

import (
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// TransitionTime is the lastTransitionTime of cond written over the conditions old: old's
// condition of its type's while its status is unchanged, so re-deciding a condition is no
// churn; now when it is new or its status changed.
func TransitionTime(old []metav1.Condition, cond metav1.Condition, now metav1.Time) metav1.Time {
	if prev := meta.FindStatusCondition(old, cond.Type); prev != nil && prev.Status == cond.Status {
		return prev.LastTransitionTime
	}
	return now
}

// condition builds a condition over old with its TransitionTime at the snapshot's time.
func (c *compiler) condition(old []metav1.Condition, typ string, ok bool, reason, msg string, gen int64) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	cond := metav1.Condition{Type: typ, Status: status, ObservedGeneration: gen, Reason: reason, Message: msg}
	cond.LastTransitionTime = TransitionTime(old, cond, c.stamp)
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
		if a.Address6 != "" {
			addrs = append(addrs, a.Address6)
		}
	}
	st.PublishedAddresses = strings.Join(addrs, ",")
	if p.ep != nil {
		st.Endpoint = &v1alpha1.EndpointStatus{Node: p.ep.node, Address: p.ep.address, Address6: p.ep.address6}
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
