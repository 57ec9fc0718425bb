// Package e2e proves kuport's install as operators run it: real kubelets and containerd in
// the lab's node namespaces, kube-controller-manager, the scheduler, kube-proxy and CoreDNS,
// kuport installed with `kubectl apply -k examples/install/` in an operator's checkout from
// image tarballs `make images` built, then upgraded, failed over, drained and uninstalled
// exactly as docs/install.md and docs/upgrade.md say, with real traffic throughout. It runs only as
// root with KUPORT_PRIVILEGED=1 (`make test` sets it).
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/lab/kubelab"
	"kuport.wlz.li/kuport/lab/labtest"
	"kuport.wlz.li/kuport/lab/netlab"
)

var repoRoot = func() string { r, _ := filepath.Abs("../../.."); return r }()

const (
	clientAddr = "198.51.100.7"
	publicAddr = "203.0.113.9"
	kuportNS   = "kuport-system"
)

// imageDirs are `make images` and `make lab-images` outputs: the release under test
// (KUPORT_IMAGES, default bin/images), the one it upgrades to (KUPORT_IMAGES_NEXT) and the
// previous release's (KUPORT_IMAGES_PREV, `make images-prev`, with its source tree in
// KUPORT_PREV_SRC), which may be absent.
func imageDirs(t *testing.T) (cur, next, prev, prevSrc string) {
	t.Helper()
	cur, next = os.Getenv("KUPORT_IMAGES"), os.Getenv("KUPORT_IMAGES_NEXT")
	if cur == "" || next == "" {
		t.Fatal("KUPORT_IMAGES and KUPORT_IMAGES_NEXT must name `make images` outputs of two versions (`make test` sets them)")
	}
	prev, prevSrc = os.Getenv("KUPORT_IMAGES_PREV"), os.Getenv("KUPORT_PREV_SRC")
	if (prev == "") != (prevSrc == "") {
		t.Fatal("KUPORT_IMAGES_PREV and KUPORT_PREV_SRC go together (`make images-prev` makes both)")
	}
	return cur, next, prev, prevSrc
}

// imageRef is where an image tarball says its image lives: repository and tag.
func imageRef(t *testing.T, path string) (repository, tag string) {
	t.Helper()
	repository, tag, err := kubelab.ImageRef(path)
	require.NoError(t, err)
	return repository, tag
}

func k8sBin(t *testing.T) string {
	t.Helper()
	bin := labtest.K8sBin(t)
	for _, b := range []string{"kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler", "coredns", "kube-router"} {
		_, err := os.Stat(filepath.Join(bin, b))
		require.NoError(t, err, "KUPORT_LAB_BIN has no %s: run lab/build-binaries.sh", b)
	}
	return bin
}

// TestPrivilegedInstall is the operator's life with kuport on a kubelet-backed cluster:
// install, traffic, upgrade, failover, drain and eviction, uninstall; then the same install
// with the Helm chart, traffic, a Helm upgrade and the Helm uninstall; then the previous
// release, upgraded to this one a side at a time and the controller rolled back. Each step needs the
// previous one, so a failed step ends the test.
func TestPrivilegedInstall(t *testing.T) {
	bin := k8sBin(t)
	cur, next, prevImages, prevSrc := imageDirs(t)
	kuportBin := labtest.KuportBin(t)
	var images []string
	dirs := []string{cur, next}
	if prevImages != "" {
		dirs = append(dirs, prevImages)
	}
	for _, d := range dirs {
		for _, img := range []string{"kuport-controller.tar", "kuport-agent.tar"} {
			images = append(images, filepath.Join(d, img))
		}
	}
	images = append(images, filepath.Join(cur, "pause.tar"))
	repository, curTag := imageRef(t, filepath.Join(cur, "kuport-agent.tar"))
	_, nextTag := imageRef(t, filepath.Join(next, "kuport-agent.tar"))
	require.NotEqual(t, curTag, nextTag, "the upgrade needs two versions")
	var prev prevRelease
	if prevImages != "" {
		_, prev.tag = imageRef(t, filepath.Join(prevImages, "kuport-agent.tar"))
		prev.src = prevSrc
		require.NotEqual(t, curTag, prev.tag, "the skew needs two versions")
	}
	// The operator's clone, in which the docs' commands run as written.
	checkout := t.TempDir()
	require.NoError(t, kubelab.Checkout(checkout, repoRoot, repository, curTag))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	l, err := kubelab.Up(ctx, kubelab.Options{
		K8sBin: bin, Bin: kuportBin, Images: images,
		Log: hclog.New(&hclog.LoggerOptions{Name: "kubelab", Level: hclog.Info, Output: os.Stderr}),
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, l.Close()) })
	t.Logf("kubelet-backed lab up in %s", time.Since(start).Round(time.Second))
	e := &env{t: t, l: l, checkout: checkout, repository: repository}

	e.deployWorkloads()
	before := map[string]string{}
	for _, n := range l.Net.Nodes() {
		before[n.Name] = e.foreignState(n.Name)
	}

	applied := time.Now()
	e.runStep("install", stepArgs{})
	e.assertAgentUnprivileged()
	e.assertControllerSoftLimit()
	e.kubectlIn(mappings, "apply", "-f", "-")
	e.waitProgrammed("demo", "local", "remote", "remote-udp")
	e.assertAnswers("tcp", 3000, "web-a")
	t.Logf("BENCH install apply_to_first_answer_s=%.1f", time.Since(applied).Seconds())
	e.assertAnswers("tcp", 3001, "web-b")
	e.assertAnswers("udp", 27015, "web-b")

	t.Run("metrics behind a token", func(t *testing.T) { e.t = t; e.assertMetricsAuth() })
	if t.Failed() {
		return
	}
	t.Run("upgrade", func(t *testing.T) { e.t = t; e.upgrade(nextTag) })
	if t.Failed() {
		return
	}
	t.Run("failover", func(t *testing.T) { e.t = t; e.failover() })
	if t.Failed() {
		return
	}
	t.Run("drain and eviction", func(t *testing.T) { e.t = t; e.drainAndEvict() })
	if t.Failed() {
		return
	}
	t.Run("uninstall", func(t *testing.T) { e.t = t; e.uninstall(before) })
	if t.Failed() {
		return
	}
	t.Run("install with Helm", func(t *testing.T) { e.t = t; e.helmInstall(curTag, nextTag, before) })
	if t.Failed() {
		return
	}
	t.Run("version skew", func(t *testing.T) {
		if prev.tag == "" {
			t.Skip("no previous release: KUPORT_IMAGES_PREV and KUPORT_PREV_SRC are unset (make images-prev)")
		}
		e.t = t
		e.skew(prev, curTag, before)
	})
}

// env carries the lab through the steps.
type env struct {
	t *testing.T
	l *kubelab.Lab
	// checkout is the operator's clone the docs' commands run in (kubelab.Checkout), and
	// repository where the images under test say they live.
	checkout, repository string
}

// pin edits the checkout's example install to tag, as docs/upgrade.md has an operator pin
// the release to install, upgrade to or clean up after.
func (e *env) pin(tag string) {
	e.t.Helper()
	require.NoError(e.t, kubelab.PinExample(e.checkout, e.repository, tag))
}

func (e *env) kubectl(args ...string) string {
	e.t.Helper()
	out, err := e.l.Cluster.KubectlRun(context.Background(), "", args...)
	require.NoError(e.t, err)
	return out
}

func (e *env) kubectlIn(stdin string, args ...string) string {
	e.t.Helper()
	out, err := e.l.Cluster.KubectlRun(context.Background(), stdin, args...)
	require.NoError(e.t, err)
	return out
}

func (e *env) exec(node string, args ...string) string {
	e.t.Helper()
	out, err := e.l.Net.Exec(context.Background(), node, args...)
	require.NoError(e.t, err, "%s: %v", node, args)
	return out
}

// assertControllerSoftLimit checks, in each controller replica's log, that the Go runtime's
// soft memory limit is 90% of the container's 1Gi limit (deploy/controller.yaml), read from
// the cgroup the kubelet and containerd made for it.
func (e *env) assertControllerSoftLimit() {
	e.t.Helper()
	pods, err := e.l.Kube.CoreV1().Pods(kuportNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kuport-controller"})
	require.NoError(e.t, err)
	require.NotEmpty(e.t, pods.Items)
	for _, p := range pods.Items {
		log := e.kubectl("-n", kuportNS, "logs", p.Name)
		assert.Contains(e.t, log, "Go runtime's soft memory limit: bytes=966367641 mib=921", "controller pod %s", p.Name)
	}
}

// assertAnswers probes publicAddr:port from the client and asserts the pod (a real pod of
// Deployment pod, named in its reply log) saw the client's own address and the reply came
// from the address the client dialed.
func (e *env) assertAnswers(proto string, port int, pod string) {
	e.t.Helper()
	var res netlab.ProbeResult
	require.Eventually(e.t, func() bool {
		r, err := e.l.Net.Probe(context.Background(), proto, fmt.Sprintf("%s:%d", publicAddr, port), time.Second)
		res = r
		return err == nil && r.PodSaw != ""
	}, 60*time.Second, 500*time.Millisecond, "%s %d: no answer", proto, port)
	assert.Equal(e.t, clientAddr, res.PodSaw, "%s %d (%s): the address the pod saw", proto, port, pod)
	assert.Equal(e.t, fmt.Sprintf("%s:%d", publicAddr, port), res.ReplyFrom, "%s %d (%s): where the reply came from", proto, port, pod)
}

func (e *env) waitProgrammed(ns string, names ...string) {
	e.t.Helper()
	for _, n := range names {
		e.kubectl("-n", ns, "wait", "portmap/"+n, "--for=condition=Programmed", "--timeout=120s")
	}
}

// assertAgentUnprivileged checks the agent pod the DaemonSet made runs without privilege.
func (e *env) assertAgentUnprivileged() {
	e.t.Helper()
	pods, err := e.l.Kube.CoreV1().Pods(kuportNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kuport-agent"})
	require.NoError(e.t, err)
	require.Len(e.t, pods.Items, len(e.l.Net.Nodes()))
	for _, p := range pods.Items {
		sc := p.Spec.Containers[0].SecurityContext
		require.NotNil(e.t, sc)
		assert.False(e.t, sc.Privileged != nil && *sc.Privileged, "agent pod %s is privileged", p.Name)
	}
}
