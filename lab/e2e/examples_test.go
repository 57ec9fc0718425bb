package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/lab"
)

var examplesDir = filepath.Join(repoRoot, "examples")

// examplePods are the lab pods behind the Services of examples/, by Service name: the
// namespace lab runs no endpoint controller, so the test writes the EndpointSlice each
// Service's selector would give, naming these pods. A pod on an accepting node (web-0) and
// pods reached over links (the others) both take part.
var examplePods = map[string]lab.Pod{
	"game":      {Namespace: "example", Name: "game-0", Node: "worker-b", IP: "10.244.18.30"},
	"web":       {Namespace: "example", Name: "web-0", Node: "edge-a", IP: "10.244.17.30"},
	"dashboard": {Namespace: "example", Name: "dashboard-0", Node: "worker-b", IP: "10.244.18.31"},
}

// examples are the objects of examples/, decoded.
type examples struct {
	classes  map[string]*v1alpha1.PortMapClass
	services []*corev1.Service
	portMaps []*v1alpha1.PortMap
}

// readExamples decodes every YAML file of examples/ (as kubectl apply -f reads a directory),
// failing on a field the types do not have.
func readExamples(t *testing.T) examples {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	ex := examples{classes: map[string]*v1alpha1.PortMapClass{}}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var u unstructured.Unstructured
			err := dec.Decode(&u.Object)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, f)
			if u.Object == nil {
				continue
			}
			var into any
			switch u.GetKind() {
			case "PortMapClass":
				c := &v1alpha1.PortMapClass{}
				ex.classes[u.GetName()], into = c, c
			case "Service":
				s := &corev1.Service{}
				ex.services, into = append(ex.services, s), s
			case "PortMap":
				pm := &v1alpha1.PortMap{}
				ex.portMaps, into = append(ex.portMaps, pm), pm
			default:
				continue
			}
			// Strict: a misspelt field fails here, not silently in a cluster.
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true), f)
		}
	}
	return ex
}

// TestExamplesAreFound: the examples are where an operator looks for them
// (`grep -rn "kind: PortMap" docs/ README.md examples/`), every file of examples/ holding a
// class or a mapping is found, and the README and the install page point at them.
func TestExamplesAreFound(t *testing.T) {
	c := exec.Command("grep", "-rn", "kind: PortMap", "docs/", "README.md", "examples/")
	c.Dir = repoRoot
	out, err := c.Output()
	require.NoError(t, err, "grep found nothing")
	ex := readExamples(t)
	require.NotEmpty(t, ex.classes)
	require.NotEmpty(t, ex.portMaps)
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		if bytes.Contains(b, []byte("kind: PortMap")) {
			assert.Contains(t, string(out), "examples/"+filepath.Base(f)+":", "grep misses %s", f)
		}
	}
	for _, doc := range []string{"README.md", "docs/install.md"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, doc))
		require.NoError(t, err)
		assert.Contains(t, string(b), "examples/", "%s does not point at examples/", doc)
	}
}

// TestPrivilegedE2EExamples applies examples/ as it is with kubectl, runs the pods its
// Services select (examplePods) and sends traffic through every mapping: to every address
// it is published on, at both ends of a range, and for a Multi class to a routed virtual
// address landing on each accepting node in turn. Each pod must see the client's address and
// each reply come from the address dialed. The classes reserve the nodes' well-known ports,
// so none warns.
func TestPrivilegedE2EExamples(t *testing.T) {
	ex := readExamples(t)
	l := startLab(t)
	ctx := context.Background()
	// The demo's classes share edge-a and the default link subnet with the examples'.
	for _, c := range []string{"public", "public-none"} {
		require.NoError(t, l.DeleteClass(ctx, c))
	}
	require.Eventually(t, func() bool {
		_, err := l.GetClass(ctx, "public")
		return err != nil
	}, 10*time.Second, 100*time.Millisecond)

	out := labShell(t, "", repoRoot, "kubectl apply -f examples/")
	t.Logf("kubectl apply -f examples/:\n%s", out)

	ports := map[string][]int32{} // the ports each Service's pod serves, by Service name
	for _, pm := range ex.portMaps {
		ports[pm.Spec.ServiceRef.Name] = append(ports[pm.Spec.ServiceRef.Name], portEnds(pm)...)
	}
	for _, svc := range ex.services {
		pod, ok := examplePods[svc.Name]
		require.True(t, ok, "examples/ Service %s has no pod in examplePods", svc.Name)
		require.Equal(t, svc.Namespace, pod.Namespace)
		require.NoError(t, l.AddPod(ctx, pod))
		require.Len(t, svc.Spec.Ports, 1, "Service %s: the lab writes one port's EndpointSlice", svc.Name)
		sp := svc.Spec.Ports[0]
		serve(t, l, pod, sp.Protocol, intsOf(ports[svc.Name])...)
		require.NoError(t, l.SetEndpoints(ctx, svc.Namespace, svc.Name, sp.Name, sp.Protocol, sp.TargetPort.IntVal,
			lab.Backend{Pod: pod, Ready: true}))
	}

	for name, c := range ex.classes {
		waitClassCondition(t, l, name, v1alpha1.ClassConditionReady, "True")
		waitClassCondition(t, l, name, v1alpha1.ClassConditionNodePortsReserved, "True")
		if c.Spec.ServingMode == v1alpha1.ServingModeMulti {
			require.GreaterOrEqual(t, len(c.Spec.Nodes), 2, "class %s: Multi on one node", name)
		}
	}
	for _, pm := range ex.portMaps {
		t.Run(pm.Name, func(t *testing.T) {
			waitCondition(t, l, pm.Namespace, pm.Name, v1alpha1.ConditionProgrammed, "True", 60*time.Second)
			got, err := l.GetPortMap(ctx, pm.Namespace, pm.Name)
			require.NoError(t, err)
			pod := examplePods[pm.Spec.ServiceRef.Name]
			proto := corev1.Protocol(pm.Spec.Protocol)
			class := ex.classes[pm.Spec.ClassName]
			require.NotNil(t, class, "PortMap %s names class %s, which examples/ does not hold", pm.Name, pm.Spec.ClassName)
			var published []string
			for _, p := range got.Status.Published {
				require.NotEmpty(t, p.Address, "%s/%s has no address", p.Node, p.Interface)
				published = append(published, p.Address)
			}
			if class.Spec.ServingMode == v1alpha1.ServingModeMulti {
				assert.Len(t, published, len(class.Spec.Nodes), "a Multi mapping answers on every accepting node")
			}
			require.NotEmpty(t, published)
			for _, port := range portEnds(pm) {
				for _, addr := range published {
					assertReaches(t, l, proto, addr, port, pod, int(port))
				}
				if class.Spec.ServingMode != v1alpha1.ServingModeMulti {
					continue
				}
				for _, via := range slices.Sorted(maps.Keys(class.Spec.Nodes)) {
					require.NoError(t, l.Net.RouteVirtual(ctx, netip.MustParseAddr(virtualAddr), via))
					assertReaches(t, l, proto, virtualAddr, port, pod, int(port))
				}
			}
		})
	}
}

// portEnds are a mapping's first and last port (one for a single port).
func portEnds(pm *v1alpha1.PortMap) []int32 {
	if pm.Spec.EndPort == nil || *pm.Spec.EndPort == pm.Spec.Port {
		return []int32{pm.Spec.Port}
	}
	return []int32{pm.Spec.Port, *pm.Spec.EndPort}
}

func intsOf(ps []int32) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = int(p)
	}
	return out
}

// waitClassCondition waits until class name's condition typ has status want ("True" or
// "False") for the class's generation.
func waitClassCondition(t *testing.T, l *lab.Lab, name, typ, want string) {
	t.Helper()
	last := "none"
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := l.GetClass(ctx, name)
		if err != nil {
			return false, nil
		}
		cond := meta.FindStatusCondition(c.Status.Conditions, typ)
		if cond == nil || cond.ObservedGeneration != c.Generation {
			return false, nil
		}
		last = fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)
		return string(cond.Status) == want, nil
	})
	require.NoError(t, err, "class %s %s: want %s, last saw %s", name, typ, want, last)
}
