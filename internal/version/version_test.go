package version

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestString(t *testing.T) {
	v, c := Version, Commit
	t.Cleanup(func() { Version, Commit = v, c })
	Version, Commit = "v0.1.0", "0123abc"
	assert.Equal(t, "kuport-agent v0.1.0 commit 0123abc "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH, String("kuport-agent"))
}
