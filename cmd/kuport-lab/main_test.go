package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRunExitCodes(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
	}{
		{nil, 2},
		{[]string{"bogus"}, 2},
		{[]string{"probe", "--to", "nowhere"}, 2},
		{[]string{"serve", "--port", "0"}, 2},
	} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, c.code, run(c.args, &stdout, &stderr), "%q", c.args)
		assert.Empty(t, stdout.String())
		assert.NotEmpty(t, stderr.String())
	}
}
