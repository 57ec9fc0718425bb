package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/controller/leader"
)

// ControllerServiceAccount is the controller's ServiceAccount in deploy/rbac.yaml, in the
// namespace the lab installs it to (leader.DefaultNamespace, as deploy/kustomization.yaml).
const ControllerServiceAccount = "kuport-controller"

// controllerTokenLifetime is how long a replica's token is valid; the lab mints one each
// time it starts a replica.
const controllerTokenLifetime = 24 * time.Hour

// rbacResources are the kinds deploy/rbac.yaml may hold, with their resources and whether
// they are namespaced.
var rbacResources = map[schema.GroupVersionKind]struct {
	resource   schema.GroupVersionResource
	namespaced bool
}{
	{Version: "v1", Kind: "ServiceAccount"}: {schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}: {
		schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, false},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"}: {
		schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, false},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"}: {
		schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"}: {
		schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, true},
}

// applyRBAC creates every object of Options.RBACFile (deploy/rbac.yaml), the namespaced
// ones without a namespace in leader.DefaultNamespace as kustomize would, so the controller replicas run with
// exactly the permissions a cluster gives them. The lab's cluster is fresh, so an object
// that exists already is an error, as is a kind other than rbacResources'.
func (l *Lab) applyRBAC(ctx context.Context) error {
	f, err := os.Open(l.opt.RBACFile)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer func() { _ = f.Close() }()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("lab: decode %s: %w", l.opt.RBACFile, err)
		}
		if len(obj.Object) == 0 {
			continue // an empty document
		}
		kind, ok := rbacResources[obj.GroupVersionKind()]
		if !ok {
			return fmt.Errorf("lab: %s: %s %q is not an RBAC object the lab installs", l.opt.RBACFile, obj.GetKind(), obj.GetName())
		}
		api := l.Dyn.Resource(kind.resource).Namespace("")
		if kind.namespaced {
			// As deploy/kustomization.yaml's transformer: an object naming its namespace (the
			// Role reading Cilium's ConfigMap in kube-system) keeps it.
			if obj.GetNamespace() == "" {
				obj.SetNamespace(leader.DefaultNamespace)
			}
			api = l.Dyn.Resource(kind.resource).Namespace(obj.GetNamespace())
		}
		if _, err := api.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("lab: %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// ControllerKubeconfig is the kubeconfig controller replicas use, in the lab dir: the
// ControllerServiceAccount's token, so they hold exactly deploy/rbac.yaml's permissions.
func (l *Lab) ControllerKubeconfig() string { return filepath.Join(l.opt.Dir, "controller.kubeconfig") }

// writeControllerKubeconfig mints a token for ControllerServiceAccount (TokenRequest,
// controllerTokenLifetime) and writes ControllerKubeconfig with it.
func (l *Lab) writeControllerKubeconfig(ctx context.Context) error {
	tr, err := l.Kube.CoreV1().ServiceAccounts(leader.DefaultNamespace).CreateToken(ctx, ControllerServiceAccount, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(controllerTokenLifetime / time.Second))},
	}, metav1.CreateOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("lab: %s has no ServiceAccount %s: %w", l.opt.RBACFile, ControllerServiceAccount, err)
	}
	if err != nil {
		return fmt.Errorf("lab: controller token: %w", err)
	}
	return l.Cluster.WriteTokenKubeconfig(l.ControllerKubeconfig(), "system:serviceaccount:"+leader.DefaultNamespace+":"+ControllerServiceAccount, tr.Status.Token)
}
