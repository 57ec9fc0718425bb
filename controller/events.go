package controller

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/status"
)

// What the controller tells about besides statuses: Events on Nodes as agents come and go,
// on PortMaps as their requests go unanswered, and the statuses a PortMap's own event queues.

// generationChanged reports whether an update of a PortMap changed its generation (its spec).
func generationChanged(old, o any) bool {
	a, okA := old.(*v1alpha1.PortMap)
	b, okB := o.(*v1alpha1.PortMap)
	return !okA || !okB || a.Generation != b.Generation
}

// portMapEvent recompiles and decides the PortMap's status again.
func (c *Controller) portMapEvent(obj any) {
	c.queue.Add(keyCompile)
	if pm, ok := obj.(*v1alpha1.PortMap); ok {
		c.statuses.Add(types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name})
	}
}

// Event reasons on a Node when its agent's stream comes and goes.
const (
	ReasonAgentConnected    = "AgentConnected"
	ReasonAgentDisconnected = "AgentDisconnected"
)

// recordAgentEvent records on the Node that its agent connected (Normal) or disconnected
// (Warning: the node keeps its kernel state but gets no new program). A node without a Node
// object in the cache gets no Event.
func (c *Controller) recordAgentEvent(recorder record.EventRecorder, node string, connected bool, agentVersion string) {
	n, err := c.nodes.Get(node)
	if err != nil || c.stopping.Load() {
		// Streams that end because this controller stops are no news about the agents.
		return
	}
	if connected {
		recorder.Eventf(n, corev1.EventTypeNormal, ReasonAgentConnected, "kuport agent %s connected", agentVersion)
		return
	}
	recorder.Event(n, corev1.EventTypeWarning, ReasonAgentDisconnected,
		"kuport agent disconnected; the node keeps its last program in the kernel but gets no new one")
}

// recordAnswers records on the PortMap that a node's DNAT entry of it turned unanswered, or
// answered again (status.Writer.RequestsEvent), and queues its status, whose unanswered rows
// say the same. A PortMap gone from the cache gets no Event.
func (c *Controller) recordAnswers(ch agents.UnansweredChange, w agents.Window) {
	obj, ok, err := c.pms.GetByKey(ch.Mapping)
	if err != nil || !ok || c.stopping.Load() {
		return
	}
	pm, ok := obj.(*v1alpha1.PortMap)
	if !ok {
		return
	}
	// Its status's unanswered rows change with the verdict.
	c.statuses.Add(types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name})
	v := ch.Verdict
	if !v.Unanswered {
		v = ch.Was
	}
	c.writer.RequestsEvent(pm, status.Answers{Node: ch.Node, Interface: ch.Interface, Unanswered: ch.Verdict.Unanswered,
		Requests: v.Requests, Since: v.Since, Window: fmt.Sprintf("%d reports and %s", w.Reports, w.Duration)})
}
