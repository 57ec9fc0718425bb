package compile

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.program.json from the compiled programs")

// datapathGolden is where the datapath team keeps its golden programs, built from the same
// lab; when a file of the same name exists there, the compiled program must equal it.
const datapathGolden = "../../datapath/testdata"

// TestGoldenPrograms compiles the shapes of docs/design/datapath.md#two-shapes and compares
// each node's program with testdata/<case>-<node>.program.json (protojson; -update rewrites
// them). The remote mapping is narrowed to enp1s0, as that page draws it and as the datapath
// team's golden remote program is. "multi" is the Multi shape of multiWorld: class intranet
// accepting on edge-a and worker-c, the pod on worker-b reached over a link from each.
// "twoclasses" is class public (demo/remote on enp1s0) beside a second Vxlan class with its
// own vni 4300 and subnet 169.254.79.0/24 accepting edge-a's wt0 (demo/i-remote, TCP 4000),
// both reaching pods on worker-b: two links over one node pair. "dualstack" is dualWorld:
// demo/local (TCP 3000) on edge-a and demo/remote (TCP 3001, enp1s0) reaching worker-b, both
// pods dual-stack, so every IPv6 entry kind and a link's IPv6 ends appear.
func TestGoldenPrograms(t *testing.T) {
	twoClasses := world(mkPortMap("remote", 0, 3000, interfaces("enp1s0")),
		mkPortMap("i-remote", 1, 4000, className("intranet"), service("i-remote")))
	twoClasses.Classes["intranet"] = intranet(1, map[string][]string{"edge-a": {"wt0"}})
	addService(twoClasses, "i-remote", 4000, mkEndpoint("i-remote-0", "10.244.18.108", "worker-b"))
	dual := dualWorld(mkPortMap("local", 0, 3000), mkPortMap("remote", 1, 3001, interfaces("enp1s0")))
	addService(dual, "remote", 3001, mkEndpoint("remote-0", "10.244.18.107", "worker-b"))
	addSlice6(dual, "remote", 3001, mkEndpoint("remote-0", "fd00:18::107", "worker-b"))
	cases := map[string]*Snapshot{
		"dualstack":  dual,
		"local":      world(mkPortMap("local", 0, 3000)),
		"remote":     world(mkPortMap("remote", 0, 3000, interfaces("enp1s0"))),
		"multi":      multiWorld(),
		"twoclasses": twoClasses,
	}
	nodes := map[string][]string{
		"local":      {"edge-a"},
		"remote":     {"edge-a", "worker-b"},
		"multi":      {"edge-a", "worker-b", "worker-c"},
		"twoclasses": {"edge-a", "worker-b"},
		"dualstack":  {"edge-a", "worker-b"},
	}
	for name, s := range cases {
		r := Compile(s)
		checkIndexMatchesPrograms(t, r)
		for _, node := range nodes[name] {
			file := name + "-" + node + ".program.json"
			t.Run(file, func(t *testing.T) {
				got := r.Programs[node]
				path := filepath.Join("testdata", file)
				if *update {
					writeProgram(t, path, got)
				}
				if d := cmp.Diff(readProgram(t, path), got, protocmp.Transform()); d != "" {
					t.Errorf("%s (-golden +compiled):\n%s", path, d)
				}
				theirs := filepath.Join(datapathGolden, file)
				if _, err := os.Stat(theirs); errors.Is(err, fs.ErrNotExist) {
					t.Skipf("%s does not exist yet", theirs)
				}
				// Version and epoch are the program store's, zero in compile's output.
				ignore := protocmp.IgnoreFields(&kuportv1.NodeProgram{}, "version", "epoch")
				if d := cmp.Diff(readProgram(t, theirs), got, protocmp.Transform(), ignore); d != "" {
					t.Errorf("%s (-datapath +compiled):\n%s", theirs, d)
				}
			})
		}
	}
}

// writeProgram writes a program as indented protojson; the re-indent removes protojson's
// deliberately unstable spacing so the file only changes when the program does.
func writeProgram(t *testing.T, path string, p *kuportv1.NodeProgram) {
	t.Helper()
	raw, err := protojson.Marshal(p)
	if err != nil {
		t.Fatalf("marshal %s: %v", path, err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		t.Fatalf("indent %s: %v", path, err)
	}
	buf.WriteByte('\n')
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatalf("mkdir: %v", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

func readProgram(t *testing.T, path string) *kuportv1.NodeProgram {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden program (run with -update to create it): %v", err)
	}
	var p kuportv1.NodeProgram
	if err := protojson.Unmarshal(raw, &p); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return &p
}
