package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// binaries are the images `make images` packs, each holding /<binary>.
var binaries = []string{"kuport-controller", "kuport-agent"}

// madeImages returns KUPORT_IMAGES, the output of `make images` (`make test` sets it), and
// skips t when it is unset.
func madeImages(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KUPORT_IMAGES")
	if dir == "" {
		t.Skip("KUPORT_IMAGES is unset: `make test` sets it to make images' output")
	}
	return dir
}

// tarballImage is the image of binary's tarball in dir.
func tarballImage(t *testing.T, dir, binary string) v1.Image {
	t.Helper()
	img, err := tarball.ImageFromPath(filepath.Join(dir, binary+".tar"), nil)
	require.NoError(t, err)
	return img
}

// indexImages returns binary's index digest in dir and its images by platform, in the
// index's order.
func indexImages(t *testing.T, dir, binary string) (v1.Hash, []string, map[string]v1.Image) {
	t.Helper()
	top, err := layout.ImageIndexFromPath(filepath.Join(dir, binary+".oci"))
	require.NoError(t, err)
	tm, err := top.IndexManifest()
	require.NoError(t, err)
	require.Len(t, tm.Manifests, 1, "the layout holds one index")
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	var platforms []string
	images := map[string]v1.Image{}
	for _, desc := range im.Manifests {
		require.NotNil(t, desc.Platform, desc.Digest)
		img, err := idx.Image(desc.Digest)
		require.NoError(t, err)
		platforms = append(platforms, desc.Platform.String())
		images[desc.Platform.String()] = img
	}
	return tm.Manifests[0].Digest, platforms, images
}

// imageFile returns the bytes of file, a path in a one-layer image, and the image's
// config.
func imageFile(t *testing.T, img v1.Image, file string) ([]byte, *v1.ConfigFile) {
	t.Helper()
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("the image holds no %s", file)
		}
		require.NoError(t, err)
		if "/"+h.Name == file || h.Name == file {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			return b, cf
		}
	}
}

// elfMachines are the ELF machines of the GOARCHes an index holds.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// TestIndexes checks the index `make images` writes beside each tarball in KUPORT_IMAGES:
// linux/amd64 and linux/arm64, each image holding a static binary of its architecture, with
// the tarball's labels; the tarball's architecture has the tarball's config, so the same
// image ID; digests.txt lists the index's digest.
func TestIndexes(t *testing.T) {
	dir := madeImages(t)
	digests, err := os.ReadFile(filepath.Join(dir, "digests.txt"))
	require.NoError(t, err)
	for _, binary := range binaries {
		t.Run(binary, func(t *testing.T) {
			tarImg := tarballImage(t, dir, binary)
			tarCF, err := tarImg.ConfigFile()
			require.NoError(t, err)
			digest, platforms, images := indexImages(t, dir, binary)
			require.Equal(t, []string{"linux/amd64", "linux/arm64"}, platforms)
			for platform, img := range images {
				bin, cf := imageFile(t, img, "/"+binary)
				assert.Equal(t, platform, cf.OS+"/"+cf.Architecture)
				assert.Equal(t, tarCF.Config.Labels, cf.Config.Labels, platform)
				f, err := elf.NewFile(bytes.NewReader(bin))
				require.NoError(t, err, platform)
				assert.Equal(t, elfMachines[cf.Architecture], f.Machine, platform)
				for _, p := range f.Progs {
					assert.NotEqual(t, elf.PT_INTERP, p.Type, "%s: dynamically linked", platform)
				}
				if cf.Architecture == tarCF.Architecture {
					id, err := img.ConfigName()
					require.NoError(t, err)
					want, err := tarImg.ConfigName()
					require.NoError(t, err)
					assert.Equal(t, want, id, "the index's %s image and the tarball's differ", platform)
				}
			}
			var listed bool
			sc := bufio.NewScanner(bytes.NewReader(digests))
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) != 3 || f[2] != strings.Join(platforms, ",") {
					continue
				}
				ref, err := name.NewTag(f[0])
				require.NoError(t, err, "digests.txt: %s", sc.Text())
				if path.Base(ref.RepositoryStr()) == binary {
					assert.Equal(t, digest.String(), f[1], "digests.txt: %s", sc.Text())
					listed = true
				}
			}
			assert.True(t, listed, "digests.txt lists no index of %s:\n%s", binary, digests)
		})
	}
}

// arm64Agent writes the index's linux/arm64 kuport-agent to a file and returns its path and
// the image's version label.
func arm64Agent(t *testing.T, dir string) (string, string) {
	t.Helper()
	_, _, images := indexImages(t, dir, "kuport-agent")
	img, ok := images["linux/arm64"]
	require.True(t, ok, "no linux/arm64 image")
	bin, cf := imageFile(t, img, "/kuport-agent")
	agent := filepath.Join(t.TempDir(), "kuport-agent")
	require.NoError(t, os.WriteFile(agent, bin, 0o755))
	return agent, cf.Config.Labels["org.opencontainers.image.version"]
}

// TestIndexArm64AgentRuns runs the index's linux/arm64 kuport-agent under qemu-aarch64 (user
// mode; the binary is static): it reports its version and platform, and its probe, a gRPC
// client, answers against a health server on loopback. The agent itself cannot run there:
// qemu's user mode refuses netfilter netlink sockets, which the agent opens first
// (TestIndexArm64AgentAppliesProgram runs it in a whole emulated machine).
func TestIndexArm64AgentRuns(t *testing.T) {
	dir := madeImages(t)
	qemu, err := exec.LookPath("qemu-aarch64")
	if err != nil {
		t.Skip("qemu-aarch64 not found: `make deps` installs it (Debian's qemu-user)")
	}
	agent, version := arm64Agent(t, dir)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, qemu, agent, "--version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `^kuport-agent `+version+` commit \S+ go\S+ linux/arm64\n$`, string(out))

	hs := health.NewServer()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	out, err = exec.CommandContext(ctx, qemu, agent, "probe", "--address", lis.Addr().String(), "--timeout", "30s").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, `service "": SERVING`+"\n", string(out))
}
