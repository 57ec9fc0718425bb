package agent

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/protobuf/proto"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestSameContent: version and epoch aside, any difference makes two programs differ.
func TestSameContent(t *testing.T) {
	p := &kuportv1.NodeProgram{Node: "edge-a", Version: 3, Epoch: 2, DnatRules: []*kuportv1.DnatRule{
		{Id: "a", InInterface: "enp1s0", ToAddress: "10.244.1.2", Ports: &kuportv1.PortRange{First: 1, Last: 1}},
		{Id: "b", InInterface: "enp1s0", ToAddress: "10.244.1.3", Ports: &kuportv1.PortRange{First: 2, Last: 2}},
	}}
	q := proto.CloneOf(p)
	q.Version, q.Epoch = 9, 7
	assert.True(t, sameContent(p, q), "version and epoch only")
	for name, edit := range map[string]func(*kuportv1.NodeProgram){
		"node":          func(p *kuportv1.NodeProgram) { p.Node = "edge-b" },
		"an entry":      func(p *kuportv1.NodeProgram) { p.DnatRules[1].ToAddress = "10.244.1.4" },
		"an entry gone": func(p *kuportv1.NodeProgram) { p.DnatRules = p.DnatRules[:1] },
		"a link":        func(p *kuportv1.NodeProgram) { p.Links = []*kuportv1.Link{{Name: "kup-x"}} },
		"unknown field": func(p *kuportv1.NodeProgram) { p.ProtoReflect().SetUnknown([]byte{0xf8, 0x7f, 1}) },
	} {
		r := proto.CloneOf(q)
		edit(r)
		assert.False(t, sameContent(p, r), name)
		assert.False(t, sameContent(r, p), name)
	}
}
