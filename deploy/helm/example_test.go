package helm_test

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const exampleOverlay = "../../examples/install"

// TestExampleOverlay checks the install docs/install.md tells operators to copy: the example
// overlay of deploy/ names both images with a repository and a tag of their own (none left at
// the base's unpublished dev), adds --underlay-interface to the agent, and renders what the
// chart renders with the overlay's Helm values, object for object; its cleanup overlay pins
// the agent image the same way.
func TestExampleOverlay(t *testing.T) {
	overlay := objects(t, renderKustomization(t, exampleOverlay))
	b, err := os.ReadFile(exampleOverlay + "/helm-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	values, err := chartutil.ReadValues(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(overlay, objects(t, renderChart(t, values))); diff != "" {
		t.Errorf("chart with %s/helm-values.yaml differs from kustomize build %s (-overlay +chart):\n%s", exampleOverlay, exampleOverlay, diff)
	}
	images := map[string]string{}
	for _, k := range []struct{ kind, name string }{{"Deployment", "kuport-controller"}, {"DaemonSet", "kuport-agent"}} {
		c := container(t, overlay, k.kind, k.name)
		images[k.name] = c["image"].(string)
		if k.name == "kuport-agent" {
			cmd, _ := c["command"].([]any)
			if len(cmd) == 0 || cmd[len(cmd)-1] != "--underlay-interface=wt0" {
				t.Errorf("agent command %v: want --underlay-interface=wt0 last", cmd)
			}
		}
	}
	cleanup := objects(t, renderKustomization(t, exampleOverlay+"/cleanup"))
	for _, o := range cleanup {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		for _, field := range []string{"initContainers", "containers"} {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			for _, c := range cs {
				if img := c.(map[string]any)["image"]; img != images["kuport-agent"] {
					t.Errorf("cleanup image %v, want the install's agent image %s", img, images["kuport-agent"])
				}
			}
		}
	}
	for name, img := range images {
		if !strings.HasPrefix(img, "registry.example.com/kuport/"+name+":") || strings.HasSuffix(img, ":dev") {
			t.Errorf("%s image %q: want the example repository and a tag other than dev", name, img)
		}
	}
}
