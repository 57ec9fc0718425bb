// Package v1alpha1 holds the kuport.wlz.li/v1alpha1 API: PortMapClass (cluster-scoped,
// written by the admin) and PortMap (namespaced, written beside a workload's Service).
// Field names, defaults, condition types and reasons are those of the founding project's
// API, which existing manifests use; what kuport adds is a strict superset
// (docs/design/api.md).
//
// +kubebuilder:object:generate=true
// +groupName=kuport.wlz.li
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of kuport's resources.
var GroupVersion = schema.GroupVersion{Group: "kuport.wlz.li", Version: "v1alpha1"}

// Resources of the group, for dynamic clients and informers.
var (
	PortMapClassesResource = GroupVersion.WithResource("portmapclasses")
	PortMapsResource       = GroupVersion.WithResource("portmaps")
)

var (
	// SchemeBuilder registers the kuport types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the kuport types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &PortMapClass{}, &PortMapClassList{}, &PortMap{}, &PortMapList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
