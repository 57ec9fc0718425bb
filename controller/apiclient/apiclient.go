// Package apiclient is the controller's typed client of kuport's API (api/v1alpha1): lists
// and watches decoded straight into the Go types, and status writes whose replies are not
// decoded. The dynamic client decodes every object into maps, which the controller then
// converted into the types by reflection, and decodes every status write's reply, which the
// controller threw away (BENCHMARKS.md, "The bulk as a share of the API server's floor").
package apiclient

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
	params = runtime.NewParameterCodec(scheme)
)

func init() {
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(fmt.Sprintf("apiclient: scheme: %v", err))
	}
}

// Client reads and writes kuport.wlz.li/v1alpha1 objects.
type Client struct {
	rest rest.Interface
}

// NewForConfig returns a Client over the API server of c (its rate limit included).
func NewForConfig(c *rest.Config) (*Client, error) {
	cfg := rest.CopyConfig(c)
	cfg.GroupVersion = &v1alpha1.GroupVersion
	cfg.APIPath = "/apis"
	cfg.ContentType = runtime.ContentTypeJSON
	cfg.NegotiatedSerializer = codecs.WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kuport api client: %w", err)
	}
	return &Client{rest: rc}, nil
}

// PortMaps lists and watches the PortMaps of every namespace, for an informer.
func (c *Client) PortMaps() *cache.ListWatch {
	return c.listWatch("portmaps", func() runtime.Object { return &v1alpha1.PortMapList{} })
}

// PortMapClasses lists and watches the PortMapClasses, for an informer.
func (c *Client) PortMapClasses() *cache.ListWatch {
	return c.listWatch("portmapclasses", func() runtime.Object { return &v1alpha1.PortMapClassList{} })
}

func (c *Client) listWatch(resource string, list func() runtime.Object) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			out := list()
			err := c.rest.Get().Resource(resource).VersionedParams(&opts, params).Do(ctx).Into(out)
			return out, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch = true
			return c.rest.Get().Resource(resource).VersionedParams(&opts, params).Watch(ctx)
		},
	}
}

// UpdatePortMapStatus writes pm's status with pm's resourceVersion (a conflict error means
// pm changed meanwhile). The stored object it returns is not decoded: its echo arrives by
// the watch.
func (c *Client) UpdatePortMapStatus(ctx context.Context, pm *v1alpha1.PortMap) error {
	return c.rest.Put().Namespace(pm.Namespace).Resource("portmaps").Name(pm.Name).SubResource("status").
		Body(pm).Do(ctx).Error()
}

// UpdateClassStatus writes cls's status with cls's resourceVersion and returns the
// resourceVersion the write gave it.
func (c *Client) UpdateClassStatus(ctx context.Context, cls *v1alpha1.PortMapClass) (string, error) {
	var out v1alpha1.PortMapClass
	err := c.rest.Put().Resource("portmapclasses").Name(cls.Name).SubResource("status").
		Body(cls).Do(ctx).Into(&out)
	return out.ResourceVersion, err
}
