package kubelab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ImageRef is where an image tarball says its image lives (its first RepoTag): the
// repository holding it, e.g. ghcr.io/kuport for ghcr.io/kuport/kuport-agent:v1, and its tag.
func ImageRef(path string) (repository, tag string, err error) {
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		return "", "", fmt.Errorf("kubelab: %s: %w", path, err)
	}
	if len(m) == 0 || len(m[0].RepoTags) == 0 {
		return "", "", fmt.Errorf("kubelab: %s names no image", path)
	}
	ref := m[0].RepoTags[0]
	colon := strings.LastIndex(ref, ":")
	return ref[:strings.LastIndex(ref[:colon], "/")], ref[colon+1:], nil
}

// Checkout copies into dir what an operator's clone holds for an install, deploy/ and
// examples/ of repo, and pins the example install to repository and tag (PinExample).
func Checkout(dir, repo, repository, tag string) error {
	for _, d := range []string{"deploy", "examples"} {
		if err := os.CopyFS(filepath.Join(dir, d), os.DirFS(filepath.Join(repo, d))); err != nil {
			return fmt.Errorf("kubelab: copy %s: %w", d, err)
		}
	}
	return PinExample(dir, repository, tag)
}

// exampleImageLines are the lines of examples/install that docs/install.md has an operator
// change for the images (those marked CHANGE), and how many of each kind a file holds.
var exampleImageLines = map[string]struct{ repositories, tags int }{
	"examples/install/kustomization.yaml":         {2, 2},
	"examples/install/cleanup/kustomization.yaml": {1, 1},
	"examples/install/helm-values.yaml":           {2, 2},
}

var (
	imageRepositoryLine = regexp.MustCompile(`(?m)^(\s*(?:newName|repository): ).*/(kuport-(?:controller|agent))\s*$`)
	imageTagLine        = regexp.MustCompile(`(?m)^(\s*(?:newTag|tag): ).*$`)
)

// PinExample sets, in the example install under dir, every image's repository and tag, as
// an operator edits them before an install or an upgrade; it fails when a file no longer
// holds the lines it expects, so the example and the lab cannot drift apart unseen.
func PinExample(dir, repository, tag string) error {
	for f, want := range exampleImageLines {
		path := filepath.Join(dir, f)
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("kubelab: %w", err)
		}
		repos, tags := len(imageRepositoryLine.FindAll(b, -1)), len(imageTagLine.FindAll(b, -1))
		if repos != want.repositories || tags != want.tags {
			return fmt.Errorf("kubelab: %s has %d image repositories and %d tags to pin, want %d and %d", f, repos, tags, want.repositories, want.tags)
		}
		b = imageRepositoryLine.ReplaceAll(b, []byte("${1}"+repository+"/${2}"))
		b = imageTagLine.ReplaceAll(b, []byte("${1}"+tag))
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return err
		}
	}
	return nil
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
