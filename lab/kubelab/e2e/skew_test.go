package e2e

import (
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/lab/kubelab"
)

// prevRelease is the release before the one under test: its source tree (an operator's
// clone of it, for its deploy/ and examples/) and the tag of its images, or zero when
// `make test` did not build it (KUPORT_PREV_SRC, KUPORT_IMAGES_PREV: make images-prev).
type prevRelease struct {
	src, tag string
}

// skew installs the previous release with its own install docs, upgrades the controller
// alone and then the agents to tag under live streams, and rolls the controller back with
// the agents new, as docs/upgrade.md says: through each step traffic keeps flowing, every
// mapping stays Programmed and no kernel object is recreated. Then it uninstalls.
func (e *env) skew(prev prevRelease, tag string, before map[string]string) {
	checkout := e.checkout
	e.checkout = e.t.TempDir()
	require.NoError(e.t, kubelab.Checkout(e.checkout, prev.src, e.repository, prev.tag))
	e.runStep("install", stepArgs{})
	e.kubectlIn(mappings, "apply", "-f", "-")
	e.waitProgrammed("demo", "local", "remote", "remote-udp")
	e.assertAnswers("tcp", 3001, "web-b")
	e.assertVersions(prev.tag, prev.tag)

	e.checkout = checkout
	e.pin(tag)
	e.skewStep("upgrade-controller", 45*time.Second, tag, prev.tag, false)
	e.skewStep("upgrade-agents", 60*time.Second, tag, tag, tableRebuiltFrom[prev.tag])
	e.skewStep("rollback-controller", 45*time.Second, prev.tag, tag, false)

	e.runStep("uninstall", stepArgs{})
	e.assertUninstalled(before)
}

// tableRebuiltFrom are the releases whose agents wrote a table this version's agents
// rebuild once: v0.1.0's table ip kuport becomes table inet kuport
// (docs/upgrade.md#agents-rebuild-their-table-once).
var tableRebuiltFrom = map[string]bool{"v0.1.0": true}

// skewStep runs the docs' step under streams lasting d and asserts it lost nothing,
// recreated nothing in the kernel (but the table, when tableRebuilt) and left every mapping
// Programmed, with the controller then at controller and every agent at agents.
func (e *env) skewStep(step string, d time.Duration, controller, agents string, tableRebuilt bool) {
	e.t.Helper()
	kernel := e.allKernelObjects()
	streams := e.streams(d)
	time.Sleep(2 * time.Second)
	e.runStep(step, stepArgs{})
	e.waitAgentVersions(agents)
	e.assertVersions(controller, agents)
	e.assertLossless(streams)
	after := e.allKernelObjects()
	if tableRebuilt {
		kernel, after = linksOf(kernel), linksOf(after)
	}
	assert.Equal(e.t, kernel, after, "%s: kernel objects recreated", step)
	for _, n := range []string{"local", "remote", "remote-udp"} {
		status := e.kubectl("-n", "demo", "get", "portmap/"+n, "-o", `jsonpath={.status.conditions[?(@.type=="Programmed")].status}`)
		assert.Equal(e.t, "True", status, "%s: PortMap %s Programmed", step, n)
	}
	e.assertAnswers("tcp", 3000, "web-a")
}

// assertVersions checks the image tags the running (not terminating) controller and agent
// pods were made from.
func (e *env) assertVersions(controller, agents string) {
	e.t.Helper()
	for app, tag := range map[string]string{"kuport-controller": controller, "kuport-agent": agents} {
		for _, p := range e.runningPods(app) {
			img := p.Spec.Containers[0].Image
			assert.True(e.t, strings.HasSuffix(img, ":"+tag), "%s pod %s runs %s, want tag %s", app, p.Name, img, tag)
		}
	}
}

// linksOf keeps the links of allKernelObjects' lists, leaving out the table's handles.
func linksOf(objects map[string]string) map[string]string {
	out := map[string]string{}
	for node, o := range objects {
		out[node] = strings.Join(ifindexRe.FindAllString(o, -1), "\n")
	}
	return out
}
