package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/util/retry"
)

// crdEstablishTimeout bounds the wait for one CRD's Established condition (about 1 s here).
const crdEstablishTimeout = 30 * time.Second

// installCRDs creates, or updates in place, every CustomResourceDefinition in dir/*.yaml and
// waits until each is Established.
func (c *Cluster) installCRDs(ctx context.Context, dir string) error {
	crds, err := readCRDs(dir)
	if err != nil {
		return err
	}
	client, err := apiextensionsclient.NewForConfig(c.rest)
	if err != nil {
		return fmt.Errorf("apiextensions client: %w", err)
	}
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range crds {
		_, err := api.Create(ctx, crd, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				crd.ResourceVersion = cur.ResourceVersion
				_, err = api.Update(ctx, crd, metav1.UpdateOptions{})
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("apply CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, crdEstablishTimeout, true, func(ctx context.Context) (bool, error) {
			cur, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range cur.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
		c.log.Debug("CRD established", "name", crd.Name)
	}
	return nil
}

// readCRDs decodes every YAML document of dir/*.yaml, in file-name order, skipping empty ones.
func readCRDs(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("list CRDs: %w", err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, fmt.Errorf("open CRD file: %w", err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(fh, 4096)
		for {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			err := dec.Decode(crd)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				_ = fh.Close()
				return nil, fmt.Errorf("decode %s: %w", f, err)
			}
			if crd.Name == "" {
				continue // an empty document
			}
			if crd.Kind != "CustomResourceDefinition" {
				_ = fh.Close()
				return nil, fmt.Errorf("%s: %s %q is not a CustomResourceDefinition", f, crd.Kind, crd.Name)
			}
			crds = append(crds, crd)
		}
		_ = fh.Close()
	}
	return crds, nil
}

// EnsureNamespace creates the Namespace name with labels (adding the labels to an existing
// one) and its `default` ServiceAccount, which the missing controller-manager would otherwise
// create and without which the ServiceAccount admission plugin rejects Pods. Idempotent.
func (c *Cluster) EnsureNamespace(ctx context.Context, name string, labels map[string]string) error {
	nsAPI := c.clients.CoreV1().Namespaces()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	_, err := nsAPI.Create(ctx, ns, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := nsAPI.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			maps.Copy(cur.Labels, labels)
			_, err = nsAPI.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	if _, err := c.clients.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("default service account in %s: %w", name, err)
	}
	return nil
}
