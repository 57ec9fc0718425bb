package controller

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// The informers' caches: typed kuport objects converted once on arrival, and the lists the
// snapshot and the dashboard read.

// typedInformer starts a dynamic informer whose cache holds typed objects (converted once, on
// arrival) and returns its indexer.
func (c *Controller) typedInformer(gvr schema.GroupVersionResource, transform cache.TransformFunc, h cache.ResourceEventHandler) (cache.Indexer, error) {
	inf := c.dyn.ForResource(gvr).Informer()
	if err := inf.SetTransform(transform); err != nil {
		return nil, fmt.Errorf("%s informer: %w", gvr.Resource, err)
	}
	if _, err := inf.AddEventHandler(h); err != nil {
		return nil, fmt.Errorf("%s event handler: %w", gvr.Resource, err)
	}
	c.synced = append(c.synced, inf.HasSynced)
	return inf.GetIndexer(), nil
}

// toTyped converts an unstructured kuport object into *T, without its managedFields
// (as lean); anything else passes unchanged (tombstones, already converted objects).
func toTyped[T any](obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	u.SetManagedFields(nil)
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return nil, fmt.Errorf("convert %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return out, nil
}

// PortMaps lists the cached PortMaps.
func (c *Controller) PortMaps() []*v1alpha1.PortMap { return cached[v1alpha1.PortMap](c.pms) }

// PortMapClasses lists the cached PortMapClasses.
func (c *Controller) PortMapClasses() []*v1alpha1.PortMapClass {
	return cached[v1alpha1.PortMapClass](c.classes)
}

// cached lists the *T objects of an indexer holding typed objects (see toTyped).
func cached[T any](idx cache.Indexer) []*T {
	var out []*T
	for _, o := range idx.List() {
		if t, ok := o.(*T); ok {
			out = append(out, t)
		}
	}
	return out
}
