package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/lab/docblocks"
)

// readmeArgs says what the lab runs in place of the README's paths and placeholders: the
// kustomizations the lab pins in place of the example overlay's (the lab overlay of deploy/
// and a pinned deploy/cleanup), the
// chart with the lab's values (lab/kubelab/helm-values.yaml, the chart's form of the lab
// overlay), the image tag installed and the one upgraded to.
type readmeArgs struct {
	deploy, cleanup, tag, newTag string
}

// labImageRepo is the repository the lab's images carry (make images' IMAGE_REPO default),
// for the README's <repository>.
const labImageRepo = "ghcr.io/kuport"

// readmeCommands returns the commands of the README block marked `<!-- e2e: name -->`
// (docblocks), one argument list per line, with the README's paths and placeholders
// replaced as readmeArgs says, so the suite runs exactly what the README tells operators.
// Each line must be a kubectl or helm command.
func readmeCommands(t *testing.T, name string, a readmeArgs) [][]string {
	t.Helper()
	b, err := docblocks.Get(filepath.Join(repoRoot, "README.md"), name)
	require.NoError(t, err)
	var out [][]string
	for _, line := range b.Commands {
		var args []string
		line = strings.NewReplacer("<tag>", a.tag, "<new tag>", a.newTag, "<repository>", labImageRepo).Replace(line)
		for _, w := range strings.Fields(line) {
			switch w {
			case "examples/install/cleanup/":
				w = a.cleanup
			case "examples/install/":
				w = a.deploy
			case "deploy/helm/kuport":
				args = append(args, filepath.Join(repoRoot, w), "-f", filepath.Join(repoRoot, "lab/kubelab/helm-values.yaml"))
				continue
			case "deploy/helm/kuport/crds/":
				w = filepath.Join(repoRoot, w)
			}
			args = append(args, w)
		}
		require.Contains(t, []string{"kubectl", "helm"}, args[0], "README %s: %q", name, line)
		require.NotContains(t, strings.Join(args, " "), "<", "README %s: a placeholder the lab does not fill: %q", name, line)
		out = append(out, args)
	}
	return out
}

// runReadme runs the README block name (readmeCommands): kubectl through the lab's
// kubectl, helm through the pinned helm binary (KUPORT_HELM) on the lab's kubeconfig.
func (e *env) runReadme(name string, a readmeArgs) {
	e.t.Helper()
	for _, args := range readmeCommands(e.t, name, a) {
		e.t.Logf("README %s: %s", name, strings.Join(args, " "))
		if args[0] == "kubectl" {
			e.kubectl(args[1:]...)
			continue
		}
		c := exec.CommandContext(context.Background(), helmBin(e.t), args[1:]...)
		c.Env = append(os.Environ(), "KUBECONFIG="+e.l.Cluster.Kubeconfig())
		out, err := c.CombinedOutput()
		require.NoError(e.t, err, "%s", out)
	}
}

// helmBin is KUPORT_HELM, the helm binary the Makefile pins (`make test` sets it).
func helmBin(t *testing.T) string {
	t.Helper()
	h := os.Getenv("KUPORT_HELM")
	if _, err := os.Stat(h); h == "" || err != nil {
		t.Fatalf("KUPORT_HELM=%q is not the helm binary; `make test` sets it (make tools builds it)", h)
	}
	return h
}

// readmeRun are the README blocks TestPrivilegedInstall runs.
var readmeRun = []string{"install", "upgrade", "uninstall", "helm-install", "helm-upgrade", "helm-uninstall"}

// TestReadmeBlocks checks, without a lab, that every README block the suite runs parses
// into kubectl and helm commands with every path and placeholder filled, and that every
// docs/ block standing for a README block (readme=, lab/docblocks) stands for one of them.
func TestReadmeBlocks(t *testing.T) {
	a := readmeArgs{deploy: "/overlay", cleanup: "/cleanup", tag: "v1", newTag: "v2"}
	for _, name := range readmeRun {
		require.NotEmpty(t, readmeCommands(t, name, a), name)
	}
	docs, err := docblocks.Docs(repoRoot)
	require.NoError(t, err)
	for _, b := range docs {
		if r, ok := b.Options["readme"]; ok {
			require.Contains(t, readmeRun, r, "%s block %s: README block %s is not run by this suite", b.File, b.Name, r)
		}
	}
	helm := readmeCommands(t, "helm-install", a)[1]
	require.Equal(t, []string{"helm", "install", "kuport", filepath.Join(repoRoot, "deploy/helm/kuport"), "-f",
		filepath.Join(repoRoot, "lab/kubelab/helm-values.yaml"), "-n", "kuport-system", "--take-ownership",
		"--set", "controller.image.repository=ghcr.io/kuport/kuport-controller", "--set", "controller.image.tag=v1",
		"--set", "agent.image.repository=ghcr.io/kuport/kuport-agent", "--set", "agent.image.tag=v1"}, helm)
	upgrade := readmeCommands(t, "helm-upgrade", a)[1]
	require.Equal(t, []string{"--set", "controller.image.tag=v2", "--set", "agent.image.tag=v2"}, upgrade[len(upgrade)-4:])
}
