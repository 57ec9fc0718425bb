package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// Pod is a lab pod: a network namespace behind its node's pod device (the CNI profile's:
// cilium_host, cni0 or its own cali* veth) and the Pod object
// that a kubelet would have reported Running and Ready.
type Pod struct {
	Namespace, Name, Node, IP string
	// IP6 is the pod's IPv6 address, which the lab's every pod has (netlab.NodeSpec.PodAddr6):
	// SetEndpoints publishes it when set, so a Service is dual-stack only where a test asks.
	IP6 string
}

// DualStack is pod p with its IPv6 address.
func (l *Lab) DualStack(p Pod) Pod {
	spec, ok := l.Net.Node(p.Node)
	if a, err := netip.ParseAddr(p.IP); ok && err == nil {
		p.IP6 = spec.PodAddr6(a).String()
	}
	return p
}

// AddPod builds the pod's namespace and writes its Pod object with status.
func (l *Lab) AddPod(ctx context.Context, p Pod) error {
	if err := l.Net.AddPod(ctx, p.Name, p.Node, p.IP); err != nil {
		return err
	}
	if err := l.Cluster.EnsureNamespace(ctx, p.Namespace, nil); err != nil {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: map[string]string{"app": p.Name}},
		Spec: corev1.PodSpec{
			NodeName:   p.Node,
			Containers: []corev1.Container{{Name: "server", Image: "kuport-lab"}},
		},
	}
	created, err := l.Kube.CoreV1().Pods(p.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("lab: pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	created.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  p.IP,
		PodIPs: []corev1.PodIP{{IP: p.IP}},
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue},
		},
	}
	if _, err := l.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("lab: pod %s/%s status: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// RemovePod deletes the Pod object (force, as a kubelet-less lab must) and the pod's
// namespace with its servers. An absent pod is success.
func (l *Lab) RemovePod(ctx context.Context, p Pod) error {
	err := l.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("lab: delete pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return l.Net.RemovePod(p.Name)
}

// Backend is one endpoint of a lab Service.
type Backend struct {
	Pod   Pod
	Ready bool
}

// Expose writes a ClusterIP Service with one named port and the EndpointSlice an endpoint
// controller would have written for it (no endpoint controller runs in the lab).
func (l *Lab) Expose(ctx context.Context, namespace, name, portName string, proto corev1.Protocol, port int32, backends ...Backend) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{{Name: portName, Protocol: proto, Port: port, TargetPort: intstr.FromInt32(port)}},
		},
	}
	if _, err := l.Kube.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("lab: service %s/%s: %w", namespace, name, err)
	}
	return l.SetEndpoints(ctx, namespace, name, portName, proto, port, backends...)
}

// SetEndpoints creates or replaces the Service's EndpointSlice (named after the Service),
// and, when a backend has an IPv6 address, its IPv6 slice (named after the Service with
// ipv6SliceSuffix), as the EndpointSlice controller gives a dual-stack Service one per family.
func (l *Lab) SetEndpoints(ctx context.Context, namespace, name, portName string, proto corev1.Protocol, port int32, backends ...Backend) error {
	if err := l.setSlice(ctx, namespace, name, name, discoveryv1.AddressTypeIPv4, portName, proto, port, backends, func(p Pod) string { return p.IP }); err != nil {
		return err
	}
	if !slices.ContainsFunc(backends, func(b Backend) bool { return b.Pod.IP6 != "" }) {
		return nil
	}
	return l.setSlice(ctx, namespace, name+ipv6SliceSuffix, name, discoveryv1.AddressTypeIPv6, portName, proto, port, backends, func(p Pod) string { return p.IP6 })
}

// ipv6SliceSuffix ends the name of a Service's IPv6 EndpointSlice.
const ipv6SliceSuffix = "-ipv6"

// setSlice creates or replaces the EndpointSlice sliceName of Service name: the backends
// that have an address of the family (addr).
func (l *Lab) setSlice(ctx context.Context, namespace, sliceName, name string, family discoveryv1.AddressType, portName string,
	proto corev1.Protocol, port int32, backends []Backend, addr func(Pod) string) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: sliceName,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "kuport-lab"},
		},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Protocol: ptr.To(proto), Port: ptr.To(port)}},
	}
	for _, b := range backends {
		if addr(b.Pod) == "" {
			continue
		}
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr(b.Pod)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(b.Ready), Serving: ptr.To(b.Ready), Terminating: ptr.To(false)},
			NodeName:   ptr.To(b.Pod.Node),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: b.Pod.Namespace, Name: b.Pod.Name},
		})
	}
	api := l.Kube.DiscoveryV1().EndpointSlices(namespace)
	cur, err := api.Get(ctx, sliceName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, slice, metav1.CreateOptions{})
	case err == nil:
		slice.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, slice, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("lab: endpointslice %s/%s: %w", namespace, sliceName, err)
	}
	return nil
}

// Unexpose deletes the Service and its EndpointSlice (force: grace period 0).
func (l *Lab) Unexpose(ctx context.Context, namespace, name string) error {
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	for _, slice := range []string{name, name + ipv6SliceSuffix} {
		if err := l.Kube.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, slice, now); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("lab: delete endpointslice %s/%s: %w", namespace, slice, err)
		}
	}
	if err := l.Kube.CoreV1().Services(namespace).Delete(ctx, name, now); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("lab: delete service %s/%s: %w", namespace, name, err)
	}
	return nil
}

func toUnstructured(obj runtime.Object, kind string) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	return u, nil
}

// ApplyClass creates the PortMapClass.
func (l *Lab) ApplyClass(ctx context.Context, c *v1alpha1.PortMapClass) error {
	u, err := toUnstructured(c, "PortMapClass")
	if err != nil {
		return err
	}
	if _, err := l.Dyn.Resource(v1alpha1.PortMapClassesResource).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("lab: portmapclass %s: %w", c.Name, err)
	}
	return nil
}

// PatchClass applies a JSON merge patch to a PortMapClass, as `kubectl patch --type merge`
// and `kubectl apply` send one: no resourceVersion, so it never conflicts with the
// controller's status writes, and only what changes goes on the wire.
func (l *Lab) PatchClass(ctx context.Context, name string, patch []byte) error {
	if _, err := l.Dyn.Resource(v1alpha1.PortMapClassesResource).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("lab: patch portmapclass %s: %w", name, err)
	}
	return nil
}

// DeleteClass deletes a PortMapClass; absent is fine.
func (l *Lab) DeleteClass(ctx context.Context, name string) error {
	err := l.Dyn.Resource(v1alpha1.PortMapClassesResource).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("lab: delete portmapclass %s: %w", name, err)
	}
	return nil
}

// GetClass reads a PortMapClass.
func (l *Lab) GetClass(ctx context.Context, name string) (*v1alpha1.PortMapClass, error) {
	u, err := l.Dyn.Resource(v1alpha1.PortMapClassesResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	c := &v1alpha1.PortMapClass{}
	return c, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, c)
}

// ApplyPortMap creates the PortMap.
func (l *Lab) ApplyPortMap(ctx context.Context, pm *v1alpha1.PortMap) error {
	u, err := toUnstructured(pm, "PortMap")
	if err != nil {
		return err
	}
	if _, err := l.Dyn.Resource(v1alpha1.PortMapsResource).Namespace(pm.Namespace).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("lab: portmap %s/%s: %w", pm.Namespace, pm.Name, err)
	}
	return nil
}

// UpdatePortMap updates a PortMap's spec (with its resourceVersion).
func (l *Lab) UpdatePortMap(ctx context.Context, pm *v1alpha1.PortMap) error {
	u, err := toUnstructured(pm, "PortMap")
	if err != nil {
		return err
	}
	if _, err := l.Dyn.Resource(v1alpha1.PortMapsResource).Namespace(pm.Namespace).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("lab: update portmap %s/%s: %w", pm.Namespace, pm.Name, err)
	}
	return nil
}

// DeletePortMap deletes a PortMap; absent is fine.
func (l *Lab) DeletePortMap(ctx context.Context, namespace, name string) error {
	err := l.Dyn.Resource(v1alpha1.PortMapsResource).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("lab: delete portmap %s/%s: %w", namespace, name, err)
	}
	return nil
}

// GetPortMap reads a PortMap.
func (l *Lab) GetPortMap(ctx context.Context, namespace, name string) (*v1alpha1.PortMap, error) {
	u, err := l.Dyn.Resource(v1alpha1.PortMapsResource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	pm := &v1alpha1.PortMap{}
	return pm, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pm)
}
