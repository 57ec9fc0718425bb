package datapath

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

var update = flag.Bool("update", false, "rewrite the golden .nft files in testdata/")

// goldenPrograms returns every testdata/<name>.program.json by name.
func goldenPrograms(t *testing.T) map[string]*kuportv1.NodeProgram {
	t.Helper()
	files, err := filepath.Glob("testdata/*.program.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	out := map[string]*kuportv1.NodeProgram{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		p := &kuportv1.NodeProgram{}
		require.NoError(t, protojson.Unmarshal(b, p), f)
		out[strings.TrimSuffix(filepath.Base(f), ".program.json")] = p
	}
	return out
}

func goldenPath(name string) string { return filepath.Join("testdata", name+".nft") }

func TestGolden(t *testing.T) {
	for name, p := range goldenPrograms(t) {
		t.Run(name, func(t *testing.T) {
			_, errs := planTable(p)
			require.Empty(t, errs, "golden programs are valid")
			got := Render(p)
			if *update {
				require.NoError(t, os.WriteFile(goldenPath(name), []byte(got), 0o644))
			}
			want, err := os.ReadFile(goldenPath(name))
			require.NoError(t, err)
			assert.Equal(t, string(want), got)
		})
	}
}
