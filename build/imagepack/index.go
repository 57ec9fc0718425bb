package imagepack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Index builds the image index of the images specs describe, one per architecture, each
// under its platform linux/<Architecture>, in the order given. Index and images have OCI
// media types throughout, so a per-architecture manifest digest differs from the tarball's
// (Image); the config, and so the image ID, is the same.
func Index(specs []ImageSpec) (v1.ImageIndex, error) {
	if len(specs) == 0 {
		return nil, errors.New("an index needs at least one image")
	}
	seen := map[string]bool{}
	var adds []mutate.IndexAddendum
	for _, spec := range specs {
		img, err := image(spec, types.OCILayer)
		if err != nil {
			return nil, err
		}
		img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		if seen[cf.Architecture] {
			return nil, fmt.Errorf("architecture %s twice in one index", cf.Architecture)
		}
		seen[cf.Architecture] = true
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
		}})
	}
	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...), nil
}

// BuildIndex writes the index of specs (Index) as an OCI image layout at dir, replacing it
// only once complete, and returns the index digest. The layout's index.json lists the one
// index, named by the specs' Name (all the same) in its org.opencontainers.image.ref.name
// annotation, so `crane push DIR NAME` pushes the index itself.
func BuildIndex(specs []ImageSpec, dir string) (v1.Hash, error) {
	if len(specs) == 0 {
		return v1.Hash{}, errors.New("an index needs at least one image")
	}
	ref := specs[0].Name
	for _, spec := range specs {
		if spec.Name != ref {
			return v1.Hash{}, fmt.Errorf("one index, two names: %s and %s", ref, spec.Name)
		}
	}
	if _, err := name.NewTag(ref, name.StrictValidation); err != nil {
		return v1.Hash{}, fmt.Errorf("image name: %w", err)
	}
	idx, err := Index(specs)
	if err != nil {
		return v1.Hash{}, err
	}
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	top := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: idx, Descriptor: v1.Descriptor{
		Annotations: map[string]string{"org.opencontainers.image.ref.name": ref},
	}})
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".*")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	// MkdirTemp makes the directory 0700; an image layout is not a secret.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return v1.Hash{}, err
	}
	if _, err := layout.Write(tmp, top); err != nil {
		return v1.Hash{}, fmt.Errorf("write %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, err
	}
	return digest, os.Rename(tmp, dir)
}
