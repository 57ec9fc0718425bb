package lab

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/lab/netlab"
)

// TestCloseWithoutTheLockKeepsTheStateDir: a lab that gave up waiting for the lab lock (no
// Net) must not remove the running lab's etcd data on its way out.
func TestCloseWithoutTheLockKeepsTheStateDir(t *testing.T) {
	dir := t.TempDir()
	l := &Lab{opt: Options{Dir: dir}, log: hclog.NewNullLogger(), agents: map[string]*netlab.Proc{}}
	data := filepath.Join(l.etcdDir(), "member")
	require.NoError(t, os.MkdirAll(data, 0o755))
	require.NoError(t, l.Close())
	assert.DirExists(t, data)
}

// TestParseOptionsKubeletCNI checks the kubelet-backed lab refuses a CNI profile: it runs
// real Flannel, so a --cni it would ignore is an error, while the namespace lab takes one.
func TestParseOptionsKubeletCNI(t *testing.T) {
	_, err := parseOptions("up", []string{"--kubelet", "--cni", "flannel"}, io.Discard)
	require.ErrorContains(t, err, "real Flannel")
	_, err = parseOptions("up", []string{"--kubelet"}, io.Discard)
	require.NoError(t, err)
	opt, err := parseOptions("up", []string{"--cni", "calico"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, netlab.CNICalico, opt.CNI)
}
