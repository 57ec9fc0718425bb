package release

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sbom is what the test reads of a CycloneDX document cyclonedx-gomod writes for a binary.
type sbom struct {
	BOMFormat string `json:"bomFormat"`
	Metadata  struct {
		Component struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"component"`
		Properties []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"properties"`
	} `json:"metadata"`
	Components []struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"components"`
}

// imageFile returns the bytes of the file at path in a one-layer image tarball, and the
// image's labels.
func imageFile(t *testing.T, image, path string) ([]byte, map[string]string) {
	t.Helper()
	img, err := tarball.ImageFromPath(image, nil)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1, image)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s holds no %s", image, path)
		}
		require.NoError(t, err)
		if "/"+h.Name == path || h.Name == path {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			return b, cf.Config.Labels
		}
	}
}

// TestImageSBOMs checks the SBOMs `make images` writes beside the image tarballs in
// KUPORT_IMAGES (`make test` sets it): each describes the very binary its image holds (its
// SHA-256) at the image's version and lists every module that binary's build info names, at
// its version.
func TestImageSBOMs(t *testing.T) {
	dir := os.Getenv("KUPORT_IMAGES")
	if dir == "" {
		t.Skip("KUPORT_IMAGES is unset: `make test` sets it to make images' output")
	}
	for binary, module := range map[string]string{
		"kuport-agent":      "github.com/google/nftables",
		"kuport-controller": "k8s.io/client-go",
	} {
		t.Run(binary, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(dir, binary+".sbom.cdx.json"))
			require.NoError(t, err)
			var doc sbom
			require.NoError(t, json.Unmarshal(b, &doc))
			assert.Equal(t, "CycloneDX", doc.BOMFormat)
			assert.Equal(t, "kuport.wlz.li/kuport", doc.Metadata.Component.Name)

			bin, labels := imageFile(t, filepath.Join(dir, binary+".tar"), "/"+binary)
			sum := sha256.Sum256(bin)
			props := map[string]string{}
			for _, p := range doc.Metadata.Properties {
				props[p.Name] = p.Value
			}
			assert.Equal(t, hex.EncodeToString(sum[:]), props["cdx:gomod:binary:hash:SHA-256"],
				"the SBOM describes another binary than the image holds")

			assert.Equal(t, labels["org.opencontainers.image.version"], doc.Metadata.Component.Version)

			info, err := buildinfo.Read(bytes.NewReader(bin))
			require.NoError(t, err)
			listed := map[string]string{}
			for _, c := range doc.Components {
				listed[c.Name] = c.Version
			}
			for _, m := range info.Deps {
				if m.Replace != nil {
					m = m.Replace
				}
				assert.Equal(t, m.Version, listed[m.Path], "module %s", m.Path)
			}
			assert.Contains(t, listed, module)
			assert.Len(t, doc.Components, len(info.Deps))
		})
	}
}
