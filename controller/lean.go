package controller

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// lean is the core informers' transform: their caches hold every Service, EndpointSlice,
// Node and Namespace of the cluster, not only kuport's, and keep of each only what the
// controller reads (a new object of the fields listed here, so a field the API gains is not
// kept either):
//
//   - of every object its name, namespace, UID and resourceVersion (the cache's key, Events'
//     object references), never managedFields or annotations;
//   - a Service nothing more: compile asks only whether the Service a PortMap names exists;
//   - a Node nothing more, for the same reason (a real Node's status, its images above all,
//     runs to kilobytes);
//   - a Namespace its labels (a class's namespaceSelector);
//   - an EndpointSlice its kubernetes.io/service-name label, address type and ports, and of
//     each endpoint its addresses, conditions, node name and pod name (compile's choice of
//     the endpoint).
//
// Anything else passes unchanged (tombstones, objects already made lean).
func lean(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return &corev1.Service{ObjectMeta: leanMeta(o.ObjectMeta)}, nil
	case *corev1.Node:
		return &corev1.Node{ObjectMeta: leanMeta(o.ObjectMeta)}, nil
	case *corev1.Namespace:
		out := &corev1.Namespace{ObjectMeta: leanMeta(o.ObjectMeta)}
		out.Labels = o.Labels
		return out, nil
	case *discoveryv1.EndpointSlice:
		return leanSlice(o), nil
	}
	return obj, nil
}

func leanMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
}

func leanSlice(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	out := &discoveryv1.EndpointSlice{ObjectMeta: leanMeta(es.ObjectMeta), AddressType: es.AddressType, Ports: es.Ports}
	if svc, ok := es.Labels[discoveryv1.LabelServiceName]; ok {
		out.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	if len(es.Endpoints) > 0 {
		out.Endpoints = make([]discoveryv1.Endpoint, len(es.Endpoints))
	}
	for i, e := range es.Endpoints {
		out.Endpoints[i] = discoveryv1.Endpoint{Addresses: e.Addresses, Conditions: e.Conditions, NodeName: e.NodeName}
		if e.TargetRef != nil {
			out.Endpoints[i].TargetRef = &corev1.ObjectReference{Name: e.TargetRef.Name}
		}
	}
	return out
}

// sameButVersion reports whether two lean objects of an update event (the cache's, lean
// already) differ in nothing but their resourceVersion.
func sameButVersion(old, o any) bool {
	a, ok := old.(runtime.Object)
	b, ok2 := o.(runtime.Object)
	if !ok || !ok2 {
		return false
	}
	a, b = a.DeepCopyObject(), b.DeepCopyObject()
	for _, obj := range []runtime.Object{a, b} {
		m, err := meta.Accessor(obj)
		if err != nil {
			return false
		}
		m.SetResourceVersion("")
	}
	return equality.Semantic.DeepEqual(a, b)
}
