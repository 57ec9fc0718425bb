package imagepack

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// binary writes content to a fresh file with the given host mode and mtime.
func binary(t *testing.T, content []byte, mode os.FileMode, mtime time.Time) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kuport-agent")
	if err := os.WriteFile(p, content, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	return p
}

func agentSpec(src string) ImageSpec {
	return ImageSpec{
		Name:       "ghcr.io/kuport/kuport-agent:v0.1.0",
		Files:      map[string]File{"/kuport-agent": {Src: src, Mode: 0o755}},
		User:       "0:0",
		Entrypoint: []string{"/kuport-agent"},
		Labels: map[string]string{
			"org.opencontainers.image.source":   "https://github.com/kuport/kuport",
			"org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
			"org.opencontainers.image.version":  "v0.1.0",
		},
		Created:      time.Unix(1700000000, 0),
		Architecture: "amd64",
	}
}

// The same binary bytes give the same digest and the same tarball bytes, whatever the host
// file's mode, mtime and path.
func TestBuildReproducible(t *testing.T) {
	content := bytes.Repeat([]byte("\x7fELF not really a binary\n"), 1000)
	dir := t.TempDir()
	var digests []Digests
	var tarballs [][]byte
	for i, src := range []string{
		binary(t, content, 0o755, time.Unix(1000, 0)),
		binary(t, content, 0o700, time.Now()),
	} {
		out := filepath.Join(dir, fmt.Sprintf("agent%d.tar", i))
		d, err := Build(agentSpec(src), out)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
		tarballs = append(tarballs, b)
	}
	if digests[0] != digests[1] {
		t.Errorf("digests differ: %+v and %+v", digests[0], digests[1])
	}
	if !bytes.Equal(tarballs[0], tarballs[1]) {
		t.Error("tarballs differ")
	}

	// Other content is another image.
	d, err := Build(agentSpec(binary(t, append(content, 'x'), 0o755, time.Unix(1000, 0))), filepath.Join(dir, "other.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Manifest == digests[0].Manifest || d.ID == digests[0].ID {
		t.Errorf("different content, same digests %+v", d)
	}
}

func TestImageConfigAndLayer(t *testing.T) {
	content := []byte("agent bytes")
	img, err := Image(agentSpec(binary(t, content, 0o600, time.Now())))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "0:0" {
		t.Errorf("User %q", cf.Config.User)
	}
	if diff := cmp.Diff([]string{"/kuport-agent"}, cf.Config.Entrypoint); diff != "" {
		t.Errorf("Entrypoint (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(agentSpec("").Labels, cf.Config.Labels); diff != "" {
		t.Errorf("Labels (-want +got):\n%s", diff)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	want := time.Unix(1700000000, 0).UTC()
	if !cf.Created.Equal(want) || len(cf.History) != 1 || !cf.History[0].Created.Equal(want) {
		t.Errorf("created %v, history %+v", cf.Created, cf.History)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers", len(layers))
	}
	entries := layerEntries(t, layers[0])
	if len(entries) != 1 {
		t.Fatalf("entries %+v", entries)
	}
	e := entries[0]
	if e.hdr.Name != "kuport-agent" || e.hdr.Typeflag != tar.TypeReg || e.hdr.Mode != 0o755 ||
		e.hdr.Uid != 0 || e.hdr.Gid != 0 || !e.hdr.ModTime.Equal(want) || !bytes.Equal(e.data, content) {
		t.Errorf("entry %+v, content %q", e.hdr, e.data)
	}
}

type entry struct {
	hdr  *tar.Header
	data []byte
}

func layerEntries(t *testing.T, l interface {
	Uncompressed() (io.ReadCloser, error)
}) []entry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var entries []entry
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, entry{hdr, data})
	}
}

// Nested paths get their parent directories, and every entry comes in path order.
func TestLayerNestedSorted(t *testing.T) {
	src := binary(t, []byte("x"), 0o755, time.Now())
	img, err := Image(ImageSpec{
		Name: "kuport.lab/pause:1",
		Files: map[string]File{
			"/usr/bin/b": {Src: src, Mode: 0o755},
			"/etc/a":     {Src: src, Mode: 0o644},
			"/usr/bin/a": {Src: src, Mode: 0o755},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range layerEntries(t, layers[0]) {
		got = append(got, e.hdr.Name+" "+os.FileMode(e.hdr.Mode).String()+" "+e.hdr.ModTime.UTC().Format(time.RFC3339))
	}
	want := []string{
		"etc/ -rwxr-xr-x 1970-01-01T00:00:00Z",
		"etc/a -rw-r--r-- 1970-01-01T00:00:00Z",
		"usr/ -rwxr-xr-x 1970-01-01T00:00:00Z",
		"usr/bin/ -rwxr-xr-x 1970-01-01T00:00:00Z",
		"usr/bin/a -rwxr-xr-x 1970-01-01T00:00:00Z",
		"usr/bin/b -rwxr-xr-x 1970-01-01T00:00:00Z",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

// The tarball names the image by its tag, and reading it back gives the digests Build
// returned (which crane push keeps).
func TestTarballRoundTrip(t *testing.T) {
	spec := agentSpec(binary(t, []byte("agent"), 0o755, time.Now()))
	out := filepath.Join(t.TempDir(), "kuport-agent.tar")
	d, err := Build(spec, out)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if got != d.Manifest {
		t.Errorf("digest read back %s, built %s", got, d.Manifest)
	}
	id, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if id != d.ID {
		t.Errorf("ID read back %s, built %s", id, d.ID)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !cmp.Equal(m[0].RepoTags, []string{spec.Name}) {
		b, _ := json.Marshal(m)
		t.Errorf("manifest.json %s", b)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("tarball %v, %v", fi, err)
	}
}

func TestBuildRefuses(t *testing.T) {
	src := binary(t, []byte("x"), 0o755, time.Now())
	for name, spec := range map[string]ImageSpec{
		"no tag":        {Name: "ghcr.io/kuport/kuport-agent", Files: map[string]File{"/a": {Src: src, Mode: 0o755}}},
		"no files":      {Name: "ghcr.io/kuport/kuport-agent:v1"},
		"relative path": {Name: "ghcr.io/kuport/kuport-agent:v1", Files: map[string]File{"a": {Src: src, Mode: 0o755}}},
		"unclean path":  {Name: "ghcr.io/kuport/kuport-agent:v1", Files: map[string]File{"/a/../b": {Src: src, Mode: 0o755}}},
		"setuid":        {Name: "ghcr.io/kuport/kuport-agent:v1", Files: map[string]File{"/a": {Src: src, Mode: 0o755 | os.ModeSetuid}}},
		"file and dir": {Name: "ghcr.io/kuport/kuport-agent:v1", Files: map[string]File{
			"/a": {Src: src, Mode: 0o755}, "/a/b": {Src: src, Mode: 0o755}}},
		"missing src": {Name: "ghcr.io/kuport/kuport-agent:v1", Files: map[string]File{"/a": {Src: src + ".missing", Mode: 0o755}}},
	} {
		out := filepath.Join(t.TempDir(), "x.tar")
		if _, err := Build(spec, out); err == nil {
			t.Errorf("%s: built", name)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: tarball left behind: %v", name, err)
		}
	}
}

// Two builds of a program with make's flags (GOBUILD in the Makefile) give identical bytes.
// The pause program stands in for kuport's binaries: it links in a second. Both builds take
// their compiled packages from the build cache, as two runs of make images do.
func TestGoBuildReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go on PATH")
	}
	var bins [][]byte
	for i := range 2 {
		out := filepath.Join(t.TempDir(), "pause")
		cmd := exec.Command(goBin, "build", "-trimpath", "-buildvcs=false",
			"-ldflags", "-X main.version=v0.1.0", "-o", out, "kuport.wlz.li/kuport/lab/pause")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %d: %v\n%s", i, err, b)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		bins = append(bins, b)
	}
	if !bytes.Equal(bins[0], bins[1]) {
		t.Error("two builds differ")
	}
}
