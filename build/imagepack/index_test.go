package imagepack

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// indexSpecs are the agent's amd64 and arm64 images, their binaries content with the arch
// appended, written to fresh files of the given host mode and mtime.
func indexSpecs(t *testing.T, content []byte, mode os.FileMode, mtime time.Time) []ImageSpec {
	t.Helper()
	var specs []ImageSpec
	for _, arch := range []string{"amd64", "arm64"} {
		spec := agentSpec(binary(t, append(bytes.Clone(content), arch...), mode, mtime))
		spec.Architecture = arch
		specs = append(specs, spec)
	}
	return specs
}

// The same inputs give the same index digest and the same layout bytes, whatever the host
// files' modes, mtimes and paths; the index holds both platforms, each image's config of its
// architecture, and names the layout's one index by the images' tag.
func TestBuildIndexReproducible(t *testing.T) {
	content := bytes.Repeat([]byte("\x7fELF not really a binary\n"), 1000)
	var digests []v1.Hash
	var indexJSON [][]byte
	var dirs []string
	for i, specs := range [][]ImageSpec{
		indexSpecs(t, content, 0o755, time.Unix(1000, 0)),
		indexSpecs(t, content, 0o700, time.Now()),
	} {
		dir := filepath.Join(t.TempDir(), "kuport-agent.oci")
		d, err := BuildIndex(specs, dir)
		if err != nil {
			t.Fatalf("build %d: %v", i, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
		indexJSON = append(indexJSON, b)
		dirs = append(dirs, dir)
	}
	if digests[0] != digests[1] {
		t.Errorf("index digests differ: %s and %s", digests[0], digests[1])
	}
	if !bytes.Equal(indexJSON[0], indexJSON[1]) {
		t.Errorf("index.json differs:\n%s\n%s", indexJSON[0], indexJSON[1])
	}
	if fi, err := os.Stat(dirs[0]); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("layout %v, %v", fi, err)
	}

	top, err := layout.ImageIndexFromPath(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Digest != digests[0] || tm.Manifests[0].MediaType != types.OCIImageIndex ||
		tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "ghcr.io/kuport/kuport-agent:v0.1.0" {
		t.Fatalf("index.json lists %+v", tm.Manifests)
	}
	idx, err := top.ImageIndex(digests[0])
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s", im.MediaType)
	}
	var platforms []string
	for _, desc := range im.Manifests {
		if desc.Platform == nil {
			t.Fatalf("%s: no platform", desc.Digest)
		}
		platforms = append(platforms, desc.Platform.String())
		if desc.MediaType != types.OCIManifestSchema1 {
			t.Errorf("%s: media type %s", desc.Platform, desc.MediaType)
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != desc.Platform.OS || cf.Architecture != desc.Platform.Architecture {
			t.Errorf("%s: config of %s/%s", desc.Platform, cf.OS, cf.Architecture)
		}
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		if len(layers) != 1 {
			t.Fatalf("%s: %d layers", desc.Platform, len(layers))
		}
		if mt, err := layers[0].MediaType(); err != nil || mt != types.OCILayer {
			t.Errorf("%s: layer media type %s, %v", desc.Platform, mt, err)
		}
		entries := layerEntries(t, layers[0])
		if len(entries) != 1 || !bytes.Equal(entries[0].data, append(bytes.Clone(content), cf.Architecture...)) {
			t.Errorf("%s: the layer holds another binary", desc.Platform)
		}
	}
	if diff := cmp.Diff([]string{"linux/amd64", "linux/arm64"}, platforms); diff != "" {
		t.Errorf("platforms (-want +got):\n%s", diff)
	}

	// Another binary is another index.
	other := indexSpecs(t, append(bytes.Clone(content), 'x'), 0o755, time.Unix(1000, 0))
	d, err := BuildIndex(other, filepath.Join(t.TempDir(), "other.oci"))
	if err != nil {
		t.Fatal(err)
	}
	if d == digests[0] {
		t.Errorf("different content, same index digest %s", d)
	}
}

// An index's image and the tarball's of the same architecture differ in media types only:
// the same config, so the same image ID.
func TestIndexImageID(t *testing.T) {
	specs := indexSpecs(t, []byte("agent"), 0o755, time.Now())
	idx, err := Index(specs)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(im.Manifests[1].Digest)
	if err != nil {
		t.Fatal(err)
	}
	tarImg, err := Image(specs[1])
	if err != nil {
		t.Fatal(err)
	}
	id, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	want, err := tarImg.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if id != want {
		t.Errorf("image ID %s in the index, %s in the tarball", id, want)
	}
}

func TestBuildIndexRefuses(t *testing.T) {
	specs := indexSpecs(t, []byte("x"), 0o755, time.Now())
	twice := []ImageSpec{specs[0], specs[0]}
	renamed := []ImageSpec{specs[0], specs[1]}
	renamed[1].Name = "ghcr.io/kuport/kuport-controller:v0.1.0"
	untagged := []ImageSpec{specs[0]}
	untagged[0].Name = "ghcr.io/kuport/kuport-agent"
	missing := []ImageSpec{specs[0]}
	missing[0].Files = map[string]File{"/kuport-agent": {Src: "/nonexistent", Mode: 0o755}}
	for name, specs := range map[string][]ImageSpec{
		"none": nil, "architecture twice": twice, "two names": renamed, "no tag": untagged, "missing src": missing,
	} {
		dir := filepath.Join(t.TempDir(), "x.oci")
		if _, err := BuildIndex(specs, dir); err == nil {
			t.Errorf("%s: built", name)
		}
		if entries, err := os.ReadDir(filepath.Dir(dir)); err != nil || len(entries) != 0 {
			t.Errorf("%s: left behind %v, %v", name, entries, err)
		}
	}
}
