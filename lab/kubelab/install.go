package kubelab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ImageTag is the tag an image tarball records (its first RepoTag).
func ImageTag(path string) (string, error) {
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		return "", fmt.Errorf("kubelab: %s: %w", path, err)
	}
	if len(m) == 0 || len(m[0].RepoTags) == 0 {
		return "", fmt.Errorf("kubelab: %s names no image", path)
	}
	ref := m[0].RepoTags[0]
	return ref[strings.LastIndex(ref, ":")+1:], nil
}

// PinnedKustomization writes dir/kustomization.yaml: base (a kustomization directory) with
// both kuport images pinned to tag, as an operator pins a release in an overlay of theirs.
func PinnedKustomization(dir, base, tag string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// kustomize takes a base only by a relative path.
	rel, err := filepath.Rel(dir, base)
	if err != nil {
		return err
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
images:
  - {name: ghcr.io/kuport/kuport-controller, newTag: %q}
  - {name: ghcr.io/kuport/kuport-agent, newTag: %q}
`, rel, tag, tag)
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// Install applies the kustomization in dir and waits for the controller Deployment and the
// agent DaemonSet to roll out: the README's install.
func (c *Cluster) Install(ctx context.Context, dir string) error {
	if _, err := c.KubectlRun(ctx, "", "apply", "-k", dir); err != nil {
		return err
	}
	for _, w := range []string{"deployment/kuport-controller", "daemonset/kuport-agent"} {
		if _, err := c.KubectlRun(ctx, "", "-n", "kuport-system", "rollout", "status", w, "--timeout=180s"); err != nil {
			return err
		}
	}
	return nil
}
