// Package imagepack packs host files (static binaries) into a one-layer container image and
// writes it as an image tarball (the docker-archive form, with RepoTags) that `ctr images
// import` loads and `crane push` publishes, and one image per architecture into an image
// index in an OCI image layout directory, which `crane push` publishes as one multi-platform
// name, with no daemon and no registry.
//
// The image depends only on the spec and the files' bytes: every timestamp is Created, every
// entry is owned by 0:0 with the mode the spec gives, entries are sorted, so the same inputs
// give the same digest on any host.
package imagepack

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is a regular file of the image, its content read from Src on the host.
type File struct {
	Src  string
	Mode fs.FileMode // permission bits only, e.g. 0o755
}

// ImageSpec says what an image holds and how it starts.
type ImageSpec struct {
	// Name is the tag the tarball records, e.g. ghcr.io/kuport/kuport-agent:v0.1.0; it needs
	// an explicit registry and tag.
	Name string
	// Files maps absolute paths in the image to their content. Parent directories are
	// created with mode 0755.
	Files      map[string]File
	User       string // "uid:gid", numeric
	Entrypoint []string
	Labels     map[string]string
	// Created is the config's created time and every timestamp in the image; the zero
	// value means the Unix epoch.
	Created time.Time
	// Architecture is the GOARCH the files were built for; "" means runtime.GOARCH.
	Architecture string
}

// Image builds the image spec describes, in memory, with Docker media types: a tarball records
// none, and what crane push sends of one has Docker's, so the manifest digest is the one a
// push of the tarball serves.
func Image(spec ImageSpec) (v1.Image, error) {
	return image(spec, types.DockerLayer)
}

// image builds the image spec describes, its layer of media type layerType.
func image(spec ImageSpec, layerType types.MediaType) (v1.Image, error) {
	created := spec.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	arch := spec.Architecture
	if arch == "" {
		arch = runtime.GOARCH
	}

	layerTar, err := layerTar(spec.Files, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:     layer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "imagepack"},
		MediaType: layerType,
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: created}
	cf.OS = "linux"
	cf.Architecture = arch
	cf.Config.User = spec.User
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Labels = spec.Labels
	return mutate.ConfigFile(img, cf)
}

// Digests identify a built image.
type Digests struct {
	// Manifest is the manifest digest: what a registry serves once the tarball is pushed
	// (crane push keeps it), and what a deployment pins as name@digest. containerd's import
	// of a tarball writes a manifest of its own, with another digest.
	Manifest v1.Hash
	// ID is the config digest, the image ID: the same after an import (crictl images) and
	// after a push.
	ID v1.Hash
}

// Build writes the image spec describes to the tarball out, replacing it only once complete.
func Build(spec ImageSpec, out string) (Digests, error) {
	tag, err := name.NewTag(spec.Name, name.StrictValidation)
	if err != nil {
		return Digests{}, fmt.Errorf("image name: %w", err)
	}
	img, err := Image(spec)
	if err != nil {
		return Digests{}, err
	}
	var d Digests
	if d.Manifest, err = img.Digest(); err != nil {
		return Digests{}, err
	}
	if d.ID, err = img.ConfigName(); err != nil {
		return Digests{}, err
	}
	f, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".*")
	if err != nil {
		return Digests{}, err
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	if err := tarball.Write(tag, img, f); err != nil {
		_ = f.Close()
		return Digests{}, fmt.Errorf("write %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return Digests{}, err
	}
	// CreateTemp makes the file 0600; an image tarball is not a secret.
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return Digests{}, err
	}
	return d, os.Rename(f.Name(), out)
}

// layerTar returns the uncompressed layer: files and their parent directories, sorted by
// path, owned by 0:0, every mtime created.
func layerTar(files map[string]File, created time.Time) ([]byte, error) {
	if len(files) == 0 {
		return nil, errors.New("an image needs at least one file")
	}
	dirs := map[string]bool{}
	var paths []string
	for p, f := range files {
		if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
			return nil, fmt.Errorf("file path %q: want a clean absolute path", p)
		}
		if f.Mode != f.Mode.Perm() {
			return nil, fmt.Errorf("file %s: mode %v: want permission bits only", p, f.Mode)
		}
		paths = append(paths, p)
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		if _, ok := files[d]; ok {
			return nil, fmt.Errorf("%s is both a file and a directory", d)
		}
		paths = append(paths, d)
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		hdr := &tar.Header{
			Name:    strings.TrimPrefix(p, "/"),
			ModTime: created,
		}
		var data []byte
		if dirs[p] {
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
			hdr.Mode = 0o755
		} else {
			var err error
			if data, err = os.ReadFile(files[p].Src); err != nil {
				return nil, err
			}
			hdr.Typeflag = tar.TypeReg
			hdr.Mode = int64(files[p].Mode)
			hdr.Size = int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
