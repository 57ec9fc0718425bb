package controller

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// The informers' caches of kuport's objects, decoded into their types by the typed client
// (controller/apiclient), and the lists the snapshot and the dashboard read.

// typedInformer makes an informer of lw's objects (example's type), whose cache keeps them
// without their managedFields (withoutManagedFields), and returns its indexer; Run runs it.
func (c *Controller) typedInformer(lw cache.ListerWatcher, example runtime.Object, h cache.ResourceEventHandler) (cache.Indexer, error) {
	inf := cache.NewSharedIndexInformer(lw, example, 0, cache.Indexers{})
	if err := inf.SetTransform(withoutManagedFields); err != nil {
		return nil, fmt.Errorf("%T informer: %w", example, err)
	}
	if _, err := inf.AddEventHandler(h); err != nil {
		return nil, fmt.Errorf("%T event handler: %w", example, err)
	}
	c.typed = append(c.typed, inf)
	c.synced = append(c.synced, inf.HasSynced)
	return inf.GetIndexer(), nil
}

// withoutManagedFields drops a kuport object's managedFields (as lean does): nothing reads
// them. Anything else passes unchanged (tombstones).
func withoutManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// PortMaps lists the cached PortMaps.
func (c *Controller) PortMaps() []*v1alpha1.PortMap { return cached[v1alpha1.PortMap](c.pms) }

// PortMapClasses lists the cached PortMapClasses.
func (c *Controller) PortMapClasses() []*v1alpha1.PortMapClass {
	return cached[v1alpha1.PortMapClass](c.classes)
}

// cached lists the *T objects of an indexer holding typed objects.
func cached[T any](idx cache.Indexer) []*T {
	var out []*T
	for _, o := range idx.List() {
		if t, ok := o.(*T); ok {
			out = append(out, t)
		}
	}
	return out
}
