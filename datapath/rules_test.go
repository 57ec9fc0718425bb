package datapath

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

func TestDiffChainKeepsOrderedRun(t *testing.T) {
	mk := func(ids ...string) []*rule {
		var rs []*rule
		for _, id := range ids {
			rs = append(rs, &rule{id: id, proto: protoTCP, dport: portRange{1, 1}, action: actionSNATSaddr})
		}
		return rs
	}
	have := func(ids ...string) []kernelRule {
		var ks []kernelRule
		for i, r := range mk(ids...) {
			ks = append(ks, kernelRule{handle: uint64(10 + i), line: r.String(), r: r})
		}
		return ks
	}
	cases := []struct {
		name string
		have []kernelRule
		want []*rule
		dels []uint64
		adds []string // "id<handle" inserted before handle, "id<0" appended
	}{
		{"same", have("a", "b", "c"), mk("a", "b", "c"), nil, nil},
		{"insert in the middle", have("a", "c"), mk("a", "b", "c"), nil, []string{"b<11"}},
		{"append", have("a"), mk("a", "b", "c"), nil, []string{"b<0", "c<0"}},
		{"delete", have("a", "b", "c"), mk("a", "c"), []uint64{11}, nil},
		{"move", have("a", "b", "c"), mk("c", "a", "b"), []uint64{12}, []string{"c<10"}},
		{"foreign rule", append(have("a"), kernelRule{handle: 99, line: "# foreign"}), mk("a"), []uint64{99}, nil},
		{"duplicate", have("a", "a"), mk("a"), []uint64{11}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dels, adds := diffChain(c.have, c.want)
			assert.Equal(t, c.dels, dels)
			var got []string
			for _, a := range adds {
				got = append(got, fmt.Sprintf("%s<%d", a.r.id, a.before))
			}
			assert.Equal(t, c.adds, got)
		})
	}
}

func TestCompileRejectsInvalidEntries(t *testing.T) {
	tcp := kuportv1.Protocol_PROTOCOL_TCP
	one := &kuportv1.PortRange{First: 3000, Last: 3000}
	p := &kuportv1.NodeProgram{
		DnatRules: []*kuportv1.DnatRule{
			{Id: "ok", InInterface: "enp1s0", Protocol: tcp, Ports: one, ToAddress: "10.0.0.1", ToPort: 3000},
			{Id: "ok", InInterface: "enp1s0", Protocol: tcp, Ports: one, ToAddress: "10.0.0.1", ToPort: 3000},
			{Id: "v6", InInterface: "enp1s0", Protocol: tcp, Ports: one, ToAddress: "::1", ToPort: 3000},
			{Id: "proto", InInterface: "enp1s0", Ports: one, ToAddress: "10.0.0.1", ToPort: 3000},
			{Id: "overflow", InInterface: "enp1s0", Protocol: tcp, Ports: &kuportv1.PortRange{First: 10, Last: 20}, ToAddress: "10.0.0.1", ToPort: 65530},
			{Id: "ifname", InInterface: "a-name-longer-than-15", Protocol: tcp, Ports: one, ToAddress: "10.0.0.1", ToPort: 3000},
			{Id: "quote\"", InInterface: "enp1s0", Protocol: tcp, Ports: one, ToAddress: "10.0.0.1", ToPort: 3000},
		},
		SnatRules: []*kuportv1.SnatRule{{Id: "kind", OutInterface: "cilium_host", Address: "10.0.0.1", Protocol: tcp, Ports: one}},
		MarkRules: []*kuportv1.MarkRule{{Id: "mark0", Address: "10.0.0.1", Protocol: tcp, Ports: one}},
	}
	rules, errs := compileRules(p)
	require.Len(t, rules, 3, "the valid DNAT rule and its two kup-count rules")
	for _, r := range rules {
		assert.Equal(t, "ok", r.id)
	}
	got := EntryErrors(errors.Join(errs...))
	var ids []string
	for _, e := range got {
		ids = append(ids, e.GetId())
	}
	assert.Equal(t, []string{"ok", "v6", "proto", "overflow", "ifname", "quote\"", "kind", "mark0"}, ids)
	assert.Contains(t, got[0].GetMessage(), "dnat ok: id used by another rule")
	assert.NotContains(t, Render(p), "v6", "invalid entries are not rendered")
}

func TestEntryErrorsOfNonEntryFailure(t *testing.T) {
	assert.Nil(t, EntryErrors(nil))
	got := EntryErrors(errors.Join(errors.New("list nftables tables: boom"), &EntryError{Kind: "link", ID: "kup-1", Err: errors.New("x")}))
	require.Len(t, got, 2)
	assert.Equal(t, "", got[0].GetId())
	assert.Equal(t, "kup-1", got[1].GetId())
	assert.Equal(t, "link kup-1: x", got[1].GetMessage())
}

func TestMarkRuleForms(t *testing.T) {
	tcp := kuportv1.Protocol_PROTOCOL_TCP
	one := &kuportv1.PortRange{First: 3000, Last: 3000}
	static, save, restore := kuportv1.MarkKind_MARK_KIND_STATIC, kuportv1.MarkKind_MARK_KIND_CT_SAVE, kuportv1.MarkKind_MARK_KIND_CT_RESTORE
	cases := []struct {
		name    string
		entry   *kuportv1.MarkRule
		want    string // the rule's text, or
		wantErr string // a part of its error
	}{
		{"static", &kuportv1.MarkRule{Kind: static, Address: "10.244.18.107", Protocol: tcp, Ports: one, Mark: 0x6b700001},
			`ip saddr 10.244.18.107 tcp sport 3000 counter meta mark set 0x6b700001 comment "id"`, ""},
		{"ct save", &kuportv1.MarkRule{Kind: save, InInterface: "kup-aaaaaaaa", Address: "169.254.79.1", Protocol: tcp, Ports: one, Mark: 0x6b700002},
			`iifname "kup-aaaaaaaa" ip daddr 169.254.79.1 tcp dport 3000 counter ct mark set 0x6b700002 comment "id"`, ""},
		{"ct restore", &kuportv1.MarkRule{Kind: restore, Address: "10.244.18.107", Protocol: tcp, Ports: &kuportv1.PortRange{First: 27015, Last: 27115}},
			`ip saddr 10.244.18.107 tcp sport 27015-27115 counter meta mark set ct mark comment "id"`, ""},
		{"no kind", &kuportv1.MarkRule{Address: "10.244.18.107", Protocol: tcp, Ports: one, Mark: 1}, "", "unknown mark kind"},
		{"static mark 0", &kuportv1.MarkRule{Kind: static, Address: "10.244.18.107", Protocol: tcp, Ports: one}, "", "mark is 0"},
		{"static with an interface", &kuportv1.MarkRule{Kind: static, InInterface: "kup-aaaaaaaa", Address: "10.244.18.107", Protocol: tcp, Ports: one, Mark: 1},
			"", "in_interface is for MARK_KIND_CT_SAVE only"},
		{"ct save without interface", &kuportv1.MarkRule{Kind: save, Address: "169.254.79.1", Protocol: tcp, Ports: one, Mark: 1}, "", "interface name"},
		{"ct save without address", &kuportv1.MarkRule{Kind: save, InInterface: "kup-aaaaaaaa", Protocol: tcp, Ports: one, Mark: 1}, "", "address"},
		{"ct save mark 0", &kuportv1.MarkRule{Kind: save, InInterface: "kup-aaaaaaaa", Address: "169.254.79.1", Protocol: tcp, Ports: one}, "", "mark is 0"},
		{"ct restore with a mark", &kuportv1.MarkRule{Kind: restore, Address: "10.244.18.107", Protocol: tcp, Ports: one, Mark: 0x6b700001},
			"", "mark 0x6b700001 is set"},
		{"ct restore with an interface", &kuportv1.MarkRule{Kind: restore, InInterface: "kup-aaaaaaaa", Address: "10.244.18.107", Protocol: tcp, Ports: one},
			"", "in_interface"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.entry.Id = "id"
			rules, errs := compileRules(&kuportv1.NodeProgram{MarkRules: []*kuportv1.MarkRule{c.entry}})
			if c.wantErr != "" {
				require.Len(t, errs, 1)
				assert.ErrorContains(t, errs[0], "mark id: "+c.wantErr)
				assert.Empty(t, rules)
				return
			}
			require.Empty(t, errs)
			require.Len(t, rules, 1)
			assert.Equal(t, "kup-mangle", rules[0].chain)
			assert.Equal(t, c.want, rules[0].String())
		})
	}
}

// TestRuleWireRoundTrip encodes every golden rule, passes each expression through the
// library's netlink encoding and back (what reading the kernel does), and decodes the
// result: it must print as the rule did, or a re-apply would rewrite it.
func TestRuleWireRoundTrip(t *testing.T) {
	for name, p := range goldenPrograms(t) {
		rules, errs := compileRules(p)
		require.Empty(t, errs, name)
		for _, r := range rules {
			set := &nftables.Set{Name: "__map0", ID: 1}
			var wire []expr.Any
			for _, e := range r.exprs(set) {
				b, err := expr.MarshalExprData(byte(nftables.TableFamilyIPv4), e)
				require.NoError(t, err)
				back := reflect.New(reflect.TypeOf(e).Elem()).Interface().(expr.Any)
				require.NoError(t, expr.Unmarshal(byte(nftables.TableFamilyIPv4), b, back))
				wire = append(wire, back)
			}
			kr := &nftables.Rule{Exprs: wire, UserData: userdata.AppendString(nil, userdata.TypeComment, r.id)}
			got, err := decodeRule(r.chain, kr, func(string) ([]portPair, error) { return r.portMap, nil })
			require.NoError(t, err, "%s: %s", name, r)
			assert.Equal(t, r.String(), got.String(), name)
		}
	}
}
