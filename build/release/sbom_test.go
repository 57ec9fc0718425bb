package release

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

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

// TestImageSBOMs checks the SBOMs `make images` writes beside the images in KUPORT_IMAGES
// (`make test` sets it), <binary>.linux-<arch>.sbom.cdx.json: each describes the very binary
// the tarball or the index holds for that architecture (its SHA-256) at the image's version
// and lists every module that binary's build info names, at its version.
func TestImageSBOMs(t *testing.T) {
	dir := madeImages(t)
	for binary, module := range map[string]string{
		"kuport-agent":      "github.com/google/nftables",
		"kuport-controller": "k8s.io/client-go",
	} {
		_, _, images := indexImages(t, dir, binary)
		images["tarball"] = tarballImage(t, dir, binary)
		for from, img := range images {
			t.Run(binary+"/"+from, func(t *testing.T) {
				bin, cf := imageFile(t, img, "/"+binary)
				b, err := os.ReadFile(filepath.Join(dir, binary+".linux-"+cf.Architecture+".sbom.cdx.json"))
				require.NoError(t, err)
				var doc sbom
				require.NoError(t, json.Unmarshal(b, &doc))
				assert.Equal(t, "CycloneDX", doc.BOMFormat)
				assert.Equal(t, "kuport.wlz.li/kuport", doc.Metadata.Component.Name)

				sum := sha256.Sum256(bin)
				props := map[string]string{}
				for _, p := range doc.Metadata.Properties {
					props[p.Name] = p.Value
				}
				assert.Equal(t, hex.EncodeToString(sum[:]), props["cdx:gomod:binary:hash:SHA-256"],
					"the SBOM describes another binary than the image holds")

				assert.Equal(t, cf.Config.Labels["org.opencontainers.image.version"], doc.Metadata.Component.Version)

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
}
