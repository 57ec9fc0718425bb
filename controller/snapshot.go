package controller

import (
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/timing"
)

// sliceByService indexes EndpointSlices by "<namespace>/<service>" (their
// kubernetes.io/service-name label), so a Service's slices are found without a list.
const sliceByService = "service"

func serviceOfSlice(obj any) ([]string, error) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	if svc := es.Labels[discoveryv1.LabelServiceName]; svc != "" {
		return []string{es.Namespace + "/" + svc}, nil
	}
	return nil, nil
}

// changes collects what the informers' events changed since the last compile took them.
type changes struct {
	mu       sync.Mutex
	portMaps map[types.NamespacedName]bool
	services map[types.NamespacedName]bool
	classes  map[types.NamespacedName]bool
	others   bool
}

// objectKey is the namespace/name of an event's object, tombstones included.
func objectKey(obj any) (types.NamespacedName, bool) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return types.NamespacedName{}, false
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	return types.NamespacedName{Namespace: ns, Name: name}, err == nil
}

func (ch *changes) add(set *map[types.NamespacedName]bool, k types.NamespacedName) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if *set == nil {
		*set = map[types.NamespacedName]bool{}
	}
	(*set)[k] = true
}

func (ch *changes) portMap(obj any) {
	if k, ok := objectKey(obj); ok {
		ch.add(&ch.portMaps, k)
	}
}

func (ch *changes) service(obj any) {
	if k, ok := objectKey(obj); ok {
		ch.add(&ch.services, k)
	}
}

func (ch *changes) class(obj any) {
	if k, ok := objectKey(obj); ok {
		ch.add(&ch.classes, k)
	}
}

// slice records the Service an EndpointSlice (or its tombstone) belongs to.
func (ch *changes) slice(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	keys, _ := serviceOfSlice(obj)
	for _, key := range keys {
		if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
			ch.add(&ch.services, types.NamespacedName{Namespace: ns, Name: name})
		}
	}
}

func (ch *changes) other() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.others = true
}

// take returns the changes collected and forgets them.
func (ch *changes) take() (portMaps, services, classes map[types.NamespacedName]bool, others bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	portMaps, services, classes, others = ch.portMaps, ch.services, ch.classes, ch.others
	ch.portMaps, ch.services, ch.classes, ch.others = nil, nil, nil, false
	return portMaps, services, classes, others
}

// nextSnapshot returns the snapshot to compile and what changed since the last one. After a
// change of a node, a namespace or an agent's state, and once per timing.ResyncPeriod (a missed
// event heals), it lists the caches whole (Changes.Others); otherwise it updates the last
// snapshot with the objects the events named alone (classes too: compile decides what a
// class's change costs), so a change costs O(the change)
// before compile too (listing 10,000 PortMaps, Services and EndpointSlices into maps took
// longer than the incremental compile of one change).
func (c *Controller) nextSnapshot() (*compile.Snapshot, *compile.Changes, error) {
	pms, svcs, classes, others := c.changes.take()
	now := time.Now()
	agents := c.reg.Agents()
	if c.snap == nil || others || now.Sub(c.fullAt) >= timing.ResyncPeriod || agentsChanged(c.snap.Agents, agents) {
		s, err := c.snapshot(now, agents)
		if err != nil {
			c.snap = nil
			return nil, nil, err
		}
		c.snap, c.fullAt = s, now
		c.pmAt = make(map[types.NamespacedName]int, len(s.PortMaps))
		for i, pm := range s.PortMaps {
			c.pmAt[types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name}] = i
		}
		return s, &compile.Changes{Others: true}, nil
	}
	s := c.snap
	s.Now, s.Agents = now, agents
	ch := &compile.Changes{PortMaps: map[types.NamespacedName]*v1alpha1.PortMap{}, Services: svcs, Classes: map[string]bool{}}
	for k := range classes {
		var cl *v1alpha1.PortMapClass
		if obj, ok, err := c.classes.GetByKey(k.Name); err == nil && ok {
			cl, _ = obj.(*v1alpha1.PortMapClass)
		}
		if cl != nil {
			s.Classes[k.Name] = cl
		} else {
			delete(s.Classes, k.Name)
		}
		ch.Classes[k.Name] = true
	}
	for k := range pms {
		var pm *v1alpha1.PortMap
		if obj, ok, err := c.pms.GetByKey(k.String()); err == nil && ok {
			pm, _ = obj.(*v1alpha1.PortMap)
		}
		c.setPortMap(k, pm)
		ch.PortMaps[k] = pm
	}
	for k := range svcs {
		svc, err := c.services.Services(k.Namespace).Get(k.Name)
		switch {
		case err == nil:
			s.Services[k] = svc
		case apierrors.IsNotFound(err):
			delete(s.Services, k)
		default:
			c.snap = nil
			return nil, nil, fmt.Errorf("service %s: %w", k, err)
		}
		objs, err := c.sliceIndex.ByIndex(sliceByService, k.String())
		if err != nil {
			c.snap = nil
			return nil, nil, fmt.Errorf("endpointslices of %s: %w", k, err)
		}
		var list []*discoveryv1.EndpointSlice
		for _, o := range objs {
			if es, ok := o.(*discoveryv1.EndpointSlice); ok {
				list = append(list, es)
			}
		}
		if len(list) == 0 {
			delete(s.EndpointSlices, k)
		} else {
			s.EndpointSlices[k] = list
		}
	}
	return s, ch, nil
}

// setPortMap puts pm (nil: none) in c.snap.PortMaps as k's.
func (c *Controller) setPortMap(k types.NamespacedName, pm *v1alpha1.PortMap) {
	s := c.snap
	i, had := c.pmAt[k]
	switch {
	case pm != nil && had:
		s.PortMaps[i] = pm
	case pm != nil:
		c.pmAt[k] = len(s.PortMaps)
		s.PortMaps = append(s.PortMaps, pm)
	case had:
		last := len(s.PortMaps) - 1
		moved := s.PortMaps[last]
		s.PortMaps[i] = moved
		c.pmAt[types.NamespacedName{Namespace: moved.Namespace, Name: moved.Name}] = i
		s.PortMaps = slices.Delete(s.PortMaps, last, last+1)
		delete(c.pmAt, k)
	}
}

// agentsChanged reports whether an agent's state differs (by identity: the registry keeps a
// state until the agent reports another) or an agent came or went.
func agentsChanged(a, b map[string]*compile.AgentState) bool {
	if len(a) != len(b) {
		return true
	}
	for n, x := range a {
		if y, ok := b[n]; !ok || x.State != y.State {
			return true
		}
	}
	return false
}

// snapshot lists the caches, with the registry's agents, into a compile.Snapshot. Objects are shared
// with the caches: compile never mutates its snapshot.
func (c *Controller) snapshot(now time.Time, agents map[string]*compile.AgentState) (*compile.Snapshot, error) {
	s := &compile.Snapshot{
		Now:            now,
		LinkRetention:  c.linkRetention,
		ReturnMarking:  c.returnMarking,
		Classes:        map[string]*v1alpha1.PortMapClass{},
		Services:       map[types.NamespacedName]*corev1.Service{},
		EndpointSlices: map[types.NamespacedName][]*discoveryv1.EndpointSlice{},
		Namespaces:     map[string]*corev1.Namespace{},
		Nodes:          map[string]*corev1.Node{},
		Agents:         agents,
		CNI:            c.cni.current(),
	}
	for _, cls := range c.PortMapClasses() {
		s.Classes[cls.Name] = cls
	}
	s.PortMaps = c.PortMaps()
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	for _, svc := range svcs {
		s.Services[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = svc
	}
	eps, err := c.slices.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list endpointslices: %w", err)
	}
	for _, es := range eps {
		if svc := es.Labels[discoveryv1.LabelServiceName]; svc != "" {
			key := types.NamespacedName{Namespace: es.Namespace, Name: svc}
			s.EndpointSlices[key] = append(s.EndpointSlices[key], es)
		}
	}
	nss, err := c.namespaces.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	for _, ns := range nss {
		s.Namespaces[ns.Name] = ns
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes {
		s.Nodes[n.Name] = n
	}
	return s, nil
}
