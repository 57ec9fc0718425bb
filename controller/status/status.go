// Package status writes what compile decided, and what the agents acknowledged, into the
// status subresource of PortMaps and PortMapClasses, and emits Kubernetes Events for the
// changes an operator must see. It owns nothing but status and events: it never changes a
// spec, and it writes only when the status differs from the object's.
package status

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/programmed"
)

// ReasonEndpointChanged is the Event reason when a PortMap's endpoint moves to another pod.
const ReasonEndpointChanged = "EndpointChanged"

// Client writes the status subresource of kuport's objects (*apiclient.Client of
// controller/apiclient).
type Client interface {
	// UpdatePortMapStatus writes pm's status with pm's resourceVersion.
	UpdatePortMapStatus(ctx context.Context, pm *v1alpha1.PortMap) error
	// UpdateClassStatus writes cls's status with cls's resourceVersion and returns the
	// resourceVersion the write gave it.
	UpdateClassStatus(ctx context.Context, cls *v1alpha1.PortMapClass) (string, error)
}

// Writer writes statuses through the status subresource and records Events.
type Writer struct {
	client   Client
	recorder record.EventRecorder
	limiter  flowcontrol.RateLimiter

	// mu guards classes: per class, its last status written, until the cache has it.
	mu      sync.Mutex
	classes map[string]*classWrite
}

// classWrite is the last status a Writer wrote of a class: the UID and resourceVersion the
// write gave the class and the resourceVersions the class had before it (since a cached
// copy last showed one of this Writer's writes). A cached copy at one of those is behind
// this Writer's own write: the informer has not delivered it yet.
type classWrite struct {
	uid    types.UID
	rv     string
	behind map[string]bool
	status v1alpha1.PortMapClassStatus
}

// NewWriter returns a Writer using client for the status subresource and recorder for
// Events; every write waits for limiter (nil: no limit), so a burst of status changes (a
// thousand PortMaps applied at once) reaches the API server at the rate it was given.
func NewWriter(client Client, recorder record.EventRecorder, limiter flowcontrol.RateLimiter) *Writer {
	if limiter == nil {
		limiter = flowcontrol.NewFakeAlwaysRateLimiter()
	}
	return &Writer{client: client, recorder: recorder, limiter: limiter, classes: map[string]*classWrite{}}
}

// mergeConditions returns want written over old, each condition's lastTransitionTime
// compile.TransitionTime's at now (whatever time compile put there): old's order is kept,
// conditions new in want follow in want's order and those absent from want are dropped.
func mergeConditions(old, want []metav1.Condition, now metav1.Time) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(want))
	stamped := func(c metav1.Condition) metav1.Condition {
		c.LastTransitionTime = compile.TransitionTime(old, c, now)
		return c
	}
	for _, c := range old {
		if w := meta.FindStatusCondition(want, c.Type); w != nil {
			out = append(out, stamped(*w))
		}
	}
	for _, c := range want {
		if meta.FindStatusCondition(old, c.Type) == nil {
			out = append(out, stamped(c))
		}
	}
	return out
}

// Desired is the status to write for pm: compile's (res) with the Programmed condition
// programmed.Decide chose (v), each condition keeping pm's lastTransitionTime while its status
// holds, and the nodes on which the registry judged its requests unanswered (unanswered,
// sorted by node).
func Desired(pm *v1alpha1.PortMap, res *compile.PortMapResult, v programmed.Verdict, unanswered []agents.UnansweredNode, now metav1.Time) v1alpha1.PortMapStatus {
	want := *res.Status.DeepCopy()
	if v.Programmed != nil {
		meta.SetStatusCondition(&want.Conditions, *v.Programmed)
	}
	want.Conditions = mergeConditions(pm.Status.Conditions, want.Conditions, now)
	want.Unanswered, want.UnansweredOn = unansweredStatus(unanswered)
	return want
}

// unansweredStatus renders the unanswered nodes as status rows and the UNANSWERED printer
// column's text, "<node> since <RFC 3339 time>" joined with commas. Since is cut to the
// second the API keeps, so an unchanged verdict compares equal to the stored status.
func unansweredStatus(nodes []agents.UnansweredNode) ([]v1alpha1.UnansweredNode, string) {
	if len(nodes) == 0 {
		return nil, ""
	}
	rows := make([]v1alpha1.UnansweredNode, len(nodes))
	text := make([]string, len(nodes))
	for i, n := range nodes {
		since := metav1.NewTime(n.Since).Rfc3339Copy()
		rows[i] = v1alpha1.UnansweredNode{Node: n.Node, Interfaces: slices.Clone(n.Interfaces), Since: since}
		text[i] = n.Node + " since " + since.UTC().Format(time.RFC3339)
	}
	return rows, strings.Join(text, ",")
}

// PortMap writes pm's status (Desired, with unanswered) when it differs from pm's, with pm's resourceVersion
// (a conflict error means pm changed meanwhile: retry from a fresh copy), and records Events:
// a Warning with the condition's reason when Accepted or Programmed turns False (or changes
// reason or message while False; not for Programmed's NotAccepted, which restates Accepted,
// nor while the agents have yet to acknowledge a change: v.Quiet), a Normal EndpointChanged
// when the endpoint moves. Nothing is written while v holds (the startup hold).
// It returns whether it wrote.
func (w *Writer) PortMap(ctx context.Context, pm *v1alpha1.PortMap, res *compile.PortMapResult, v programmed.Verdict, unanswered []agents.UnansweredNode) (bool, error) {
	if v.Hold {
		return false, nil
	}
	want := Desired(pm, res, v, unanswered, metav1.Now())
	if equality.Semantic.DeepEqual(pm.Status, want) {
		return false, nil
	}
	obj := pm.DeepCopy()
	obj.Status = want
	obj.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("PortMap"))
	if err := w.limiter.Wait(ctx); err != nil {
		return false, fmt.Errorf("portmap %s/%s status: rate limiter: %w", pm.Namespace, pm.Name, err)
	}
	if err := w.client.UpdatePortMapStatus(ctx, obj); err != nil {
		return false, fmt.Errorf("portmap %s/%s status: %w", pm.Namespace, pm.Name, err)
	}
	for _, t := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionProgrammed} {
		before := meta.FindStatusCondition(pm.Status.Conditions, t)
		after := meta.FindStatusCondition(want.Conditions, t)
		// Programmed/NotAccepted only restates Accepted's event, and waiting for the agents'
		// acknowledgement after every change is no warning.
		quiet := t == v1alpha1.ConditionProgrammed && (v.Quiet || after != nil && after.Reason == v1alpha1.ReasonNotAccepted)
		if after != nil && after.Status == metav1.ConditionFalse && !quiet &&
			(before == nil || before.Status != metav1.ConditionFalse || before.Reason != after.Reason || before.Message != after.Message) {
			w.recorder.Eventf(obj, corev1.EventTypeWarning, after.Reason, "%s: %s", t, after.Message)
		}
	}
	// The pod is its node and address (its IPv6 one when it has no IPv4 one): the same pod
	// gaining or losing its other family's address has not moved.
	if before, after := pm.Status.Endpoint, want.Endpoint; before != nil && after != nil &&
		(before.Node != after.Node || podAddress(before) != podAddress(after)) {
		w.recorder.Eventf(obj, corev1.EventTypeNormal, ReasonEndpointChanged, "endpoint moved from %s on %s to %s on %s",
			podAddress(before), before.Node, podAddress(after), after.Node)
	}
	return true, nil
}

// podAddress names an endpoint's pod by its address: the IPv4 one, else the IPv6 one.
func podAddress(e *v1alpha1.EndpointStatus) string { return cmp.Or(e.Address, e.Address6) }

// Class writes cls's status as compile computed it (want) when it differs from cls's, with
// cls's resourceVersion; conditions keep their lastTransitionTime while their status holds.
// A condition written False (Ready refused, NodePortsReserved warning), or False with a new
// reason or message, is also recorded as a Warning Event with its reason. It returns whether
// it wrote.
//
// cls is the informer's copy, which receives this Writer's own last write some time after
// it returned (most of a second for a class of 1,000 nodes on a busy API server). While cls
// is still behind it, the status compared with and written over is the one this Writer
// wrote, with the resourceVersion that write gave the class: the same status is not written
// again, and a new one does not fail as a conflict (which made the controller list and
// compile everything again). A write by anyone else since still fails as a conflict.
func (w *Writer) Class(ctx context.Context, cls *v1alpha1.PortMapClass, want *v1alpha1.PortMapClassStatus) (bool, error) {
	w.mu.Lock()
	last := w.classes[cls.Name]
	delete(w.classes, cls.Name)
	w.mu.Unlock()
	cur, rv := cls.Status, cls.ResourceVersion
	lagging := last != nil && last.uid == cls.UID && last.behind[cls.ResourceVersion]
	if lagging {
		cur, rv = last.status, last.rv
	}
	st := *want.DeepCopy()
	st.Conditions = mergeConditions(cur.Conditions, st.Conditions, metav1.Now())
	if equality.Semantic.DeepEqual(cur, st) {
		if lagging {
			w.remember(cls.Name, last)
		}
		return false, nil
	}
	obj := cls.DeepCopy()
	obj.Status = st
	obj.ResourceVersion = rv
	obj.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("PortMapClass"))
	if err := w.limiter.Wait(ctx); err != nil {
		return false, fmt.Errorf("portmapclass %s status: rate limiter: %w", cls.Name, err)
	}
	written, err := w.client.UpdateClassStatus(ctx, obj)
	if err != nil {
		return false, fmt.Errorf("portmapclass %s status: %w", cls.Name, err)
	}
	for _, after := range st.Conditions {
		before := meta.FindStatusCondition(cur.Conditions, after.Type)
		if after.Status == metav1.ConditionFalse &&
			(before == nil || before.Status != metav1.ConditionFalse || before.Reason != after.Reason || before.Message != after.Message) {
			w.recorder.Eventf(obj, corev1.EventTypeWarning, after.Reason, "%s: %s", after.Type, after.Message)
		}
	}
	behind := map[string]bool{rv: true}
	if lagging {
		maps.Copy(behind, last.behind)
	}
	w.remember(cls.Name, &classWrite{uid: cls.UID, rv: written, behind: behind, status: st})
	return true, nil
}

func (w *Writer) remember(name string, cw *classWrite) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.classes[name] = cw
}

// Event reasons on a PortMap whose requests a node forwards without seeing a reply
// (agents.Judge over the node's reports), and when replies flow again.
const (
	ReasonRequestsUnanswered = "RequestsUnanswered"
	ReasonRequestsAnswered   = "RequestsAnswered"
)

// Answers is one DNAT entry of a PortMap turning unanswered, or answered again, on a node.
type Answers struct {
	Node, Interface string
	// Unanswered is the entry's state now.
	Unanswered bool
	// Requests arrived since the last reply and Since is when the report showing the first
	// of them arrived: now when unanswered, until the reply when answered again.
	Requests uint64
	Since    time.Time
	// Window is the controller's window, as the operator set it ("3 reports and 10s").
	Window string
}

// RequestsEvent records on pm that a node forwards its requests and sees no reply (Warning
// RequestsUnanswered) or that replies flow again (Normal RequestsAnswered), naming the node,
// the interface and the counters. The caller calls it once per transition.
func (w *Writer) RequestsEvent(pm *v1alpha1.PortMap, a Answers) {
	obj := pm.DeepCopy()
	obj.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("PortMap"))
	since := a.Since.UTC().Format(time.RFC3339)
	if a.Unanswered {
		w.recorder.Eventf(obj, corev1.EventTypeWarning, ReasonRequestsUnanswered,
			"node %s interface %s: %d requests since %s, 0 replies over %s: something after kuport's count drops them (another table's forward chain at policy drop, a host firewall), the pod does not answer, or the CNI forwards the pod's traffic past netfilter (Cilium eBPF host routing or netkit, Calico eBPF; docs/troubleshooting.md)",
			a.Node, a.Interface, a.Requests, since, a.Window)
		return
	}
	w.recorder.Eventf(obj, corev1.EventTypeNormal, ReasonRequestsAnswered,
		"node %s interface %s: replies flow again (%d requests had gone unanswered since %s)", a.Node, a.Interface, a.Requests, since)
}
