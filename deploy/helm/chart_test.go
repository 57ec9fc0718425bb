// Package helm_test checks the Helm chart deploy/helm/kuport against the kustomize base
// deploy/: its default render is the base object for object, its values land where they
// should, and helm lint finds nothing.
package helm_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	chartDir  = "kuport"
	baseDir   = ".."
	namespace = "kuport-system"
)

// kubeVersion is the Kubernetes the chart is rendered and linted for: the version kuport is
// tested on (README, Install on a cluster). Without it, the library's default (v1.20) fails the
// chart's kubeVersion (>=1.27).
var kubeVersion = &chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}

// renderChart renders the chart as `helm install --dry-run` does with no cluster (helm
// template), CRDs included, into release kuport in namespace kuport-system.
func renderChart(t *testing.T, values map[string]any) []byte {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(&action.Configuration{
		Releases: storage.Init(driver.NewMemory()),
		Log:      t.Logf,
	})
	install.DryRun = true
	install.ClientOnly = true
	install.IncludeCRDs = true
	install.Replace = true
	install.ReleaseName = "kuport"
	install.Namespace = namespace
	install.KubeVersion = kubeVersion
	rel, err := install.Run(chrt, values)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(rel.Manifest)
}

// renderBase renders deploy/ as `kubectl kustomize deploy/` does.
func renderBase(t *testing.T) []byte { return renderKustomization(t, baseDir) }

// renderKustomization renders dir as `kubectl kustomize <dir>` does.
func renderKustomization(t *testing.T, dir string) []byte {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatal(err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// objects decodes a multi-document manifest into its objects keyed by apiVersion, kind,
// namespace and name (numbers as the API machinery decodes them: int64 or float64); a key seen
// twice fails the test.
func objects(t *testing.T, manifest []byte) map[string]*unstructured.Unstructured {
	t.Helper()
	objs := map[string]*unstructured.Unstructured{}
	docs := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatal(err)
		}
		j, err := sigsyaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatal(err)
		}
		if string(j) == "null" {
			continue // an empty document
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			t.Fatalf("%v:\n%s", err, doc)
		}
		key := fmt.Sprintf("%s %s %s/%s", u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName())
		if _, dup := objs[key]; dup {
			t.Fatalf("%s twice", key)
		}
		objs[key] = u
	}
}

func TestDefaultRenderEqualsKustomizeBase(t *testing.T) {
	chart, base := objects(t, renderChart(t, nil)), objects(t, renderBase(t))
	if len(base) == 0 {
		t.Fatal("the kustomize base rendered no objects")
	}
	if diff := cmp.Diff(base, chart); diff != "" {
		t.Errorf("chart's default render differs from kustomize build deploy/ (-base +chart):\n%s", diff)
	}
	for key, obj := range chart {
		// The Role reading Cilium's ConfigMap, and its binding, live beside it in kube-system.
		ciliumConfig := obj.GetName() == "kuport-controller-cilium-config" && obj.GetNamespace() == "kube-system"
		if obj.GetKind() != "Namespace" && obj.GetKind() != "CustomResourceDefinition" &&
			!strings.HasPrefix(obj.GetKind(), "Cluster") && obj.GetNamespace() != namespace && !ciliumConfig {
			t.Errorf("%s: namespace %q, want %q", key, obj.GetNamespace(), namespace)
		}
	}
}

// container returns the first container of the workload of that kind and name.
func container(t *testing.T, objs map[string]*unstructured.Unstructured, kind, name string) map[string]any {
	t.Helper()
	obj, ok := objs[fmt.Sprintf("apps/v1 %s %s/%s", kind, namespace, name)]
	if !ok {
		t.Fatalf("no %s %s", kind, name)
	}
	containers, _, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if err != nil || len(containers) == 0 {
		t.Fatalf("%s %s: no containers (%v)", kind, name, err)
	}
	return containers[0].(map[string]any)
}

func TestValuesLand(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	values := map[string]any{
		"imagePullSecrets": []any{map[string]any{"name": "registry"}},
		"controller": map[string]any{
			"image":         map[string]any{"repository": "registry.example/kuport-controller", "tag": "v0.2.0", "pullPolicy": "Always"},
			"replicas":      3,
			"logLevel":      "debug",
			"resources":     map[string]any{"limits": map[string]any{"memory": "2Gi"}},
			"extraArgs":     []any{"--link-retention=48h"},
			"returnMarking": map[string]any{"markMask": "0x1f0000", "tables": "1000-1126", "rulePrefs": "201,202"},
		},
		"agent": map[string]any{
			"image":        map[string]any{"repository": "registry.example/kuport-agent", "tag": "v0.2.0"},
			"controllers":  []any{"kuport-controller.kuport-system.svc:7443", "10.0.0.1:7443"},
			"logLevel":     "warn",
			"extraArgs":    []any{"--underlay-interface=wt0"},
			"nodeSelector": map[string]any{"kuport.wlz.li/agent": "true"},
			"tolerations":  []any{},
		},
	}
	objs := objects(t, renderChart(t, values))

	deploy := objs["apps/v1 Deployment kuport-system/kuport-controller"]
	if replicas, _, _ := unstructured.NestedInt64(deploy.Object, "spec", "replicas"); replicas != 3 {
		t.Errorf("controller replicas %d, want 3", replicas)
	}
	ctrl := container(t, objs, "Deployment", "kuport-controller")
	agent := container(t, objs, "DaemonSet", "kuport-agent")
	want := map[string]any{
		"controller image":      "registry.example/kuport-controller:v0.2.0",
		"controller pullPolicy": "Always",
		// Helm merges maps with the defaults: the requests stay.
		"controller resources": map[string]any{"limits": map[string]any{"memory": "2Gi"},
			"requests": map[string]any{"cpu": "50m", "memory": "256Mi"}},
		"controller command": []any{"/kuport-controller", "--grpc-listen=0.0.0.0:7443", "--http-listen=0.0.0.0:9090",
			"--http-loopback-listen=127.0.0.1:9091", "--health-listen=0.0.0.0:8081", "--lease-namespace=$(POD_NAMESPACE)",
			"--agent-service-account=$(POD_NAMESPACE):kuport-agent",
			"--tls-secret=kuport-controller-tls", "--tls-ca-configmap=kuport-controller-ca",
			"--log-level=debug", "--return-mark-mask=0x1f0000", "--return-tables=1000-1126", "--return-rule-prefs=201,202",
			"--link-retention=48h"},
		"agent image": "registry.example/kuport-agent:v0.2.0",
		"agent command": []any{"/kuport-agent", "--node-name=$(NODE_NAME)",
			"--controller=kuport-controller.kuport-system.svc:7443", "--controller=10.0.0.1:7443",
			"--token-file=/var/run/secrets/kuport/token", "--epoch-file=/run/kuport/epoch",
			"--controller-ca-file=/var/run/kuport/ca/ca.crt", "--log-level=warn", "--underlay-interface=wt0"},
	}
	got := map[string]any{
		"controller image":      ctrl["image"],
		"controller pullPolicy": ctrl["imagePullPolicy"],
		"controller resources":  ctrl["resources"],
		"controller command":    ctrl["command"],
		"agent image":           agent["image"],
		"agent command":         agent["command"],
	}
	ds := objs["apps/v1 DaemonSet kuport-system/kuport-agent"]
	for _, obj := range []*unstructured.Unstructured{deploy, ds} {
		secrets, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "imagePullSecrets")
		got[obj.GetKind()+" imagePullSecrets"] = secrets
		want[obj.GetKind()+" imagePullSecrets"] = []any{map[string]any{"name": "registry"}}
	}
	got["agent nodeSelector"], _, _ = unstructured.NestedFieldNoCopy(ds.Object, "spec", "template", "spec", "nodeSelector")
	want["agent nodeSelector"] = map[string]any{"kubernetes.io/os": "linux", "kuport.wlz.li/agent": "true"}
	got["agent tolerations"], _, _ = unstructured.NestedFieldNoCopy(ds.Object, "spec", "template", "spec", "tolerations")
	want["agent tolerations"] = nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rendered values (-want +got):\n%s", diff)
	}

	// A digest replaces the tag.
	objs = objects(t, renderChart(t, map[string]any{"agent": map[string]any{"image": map[string]any{"digest": digest}}}))
	if got, want := container(t, objs, "DaemonSet", "kuport-agent")["image"], "ghcr.io/kuport/kuport-agent@"+digest; got != want {
		t.Errorf("agent image %v, want %s", got, want)
	}
}

// TestLint is helm lint: no warning and no error, with the default values.
func TestLint(t *testing.T) {
	linter := lint.AllWithKubeVersion(chartDir, nil, namespace, kubeVersion)
	for _, msg := range linter.Messages {
		if msg.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", msg)
		} else {
			t.Logf("helm lint: %s", msg)
		}
	}
}

// TestNetworkPolicyValues: networkPolicy.enabled=false renders no NetworkPolicy;
// nodesFrom becomes the sources of the gRPC and health ports, metricsFrom those of the
// metrics port.
func TestNetworkPolicyValues(t *testing.T) {
	const key = "networking.k8s.io/v1 NetworkPolicy " + namespace + "/kuport-controller"
	if _, ok := objects(t, renderChart(t, map[string]any{"networkPolicy": map[string]any{"enabled": false}}))[key]; ok {
		t.Errorf("networkPolicy.enabled=false: %s rendered", key)
	}
	nodes := []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.0.0.0/24"}}}
	metrics := []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}}
	policy, ok := objects(t, renderChart(t, map[string]any{"networkPolicy": map[string]any{"nodesFrom": nodes, "metricsFrom": metrics}}))[key]
	if !ok {
		t.Fatalf("no %s", key)
	}
	ingress, _, _ := unstructured.NestedSlice(policy.Object, "spec", "ingress")
	want := []any{
		map[string]any{"from": nodes, "ports": []any{
			map[string]any{"protocol": "TCP", "port": int64(7443)}, map[string]any{"protocol": "TCP", "port": int64(8081)}}},
		map[string]any{"from": metrics, "ports": []any{map[string]any{"protocol": "TCP", "port": int64(9090)}}},
	}
	if diff := cmp.Diff(want, ingress); diff != "" {
		t.Errorf("ingress (-want +got):\n%s", diff)
	}
}
