package datapath

import (
	"strings"

	"github.com/google/nftables"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// block is one set or chain as `nft list` prints it: its opening word and name, its lines,
// and a set's element lines.
type block struct {
	head     string
	lines    []string
	elements []string
	// perLine: elements nft prints on one line, 0 for one per line.
	perLine int
}

// setBlock is set s's block with its element lines. nft prints the elements of a set keyed
// by a mark alone five to a line, those of a concatenation one per line (nft 1.0.6,
// src/expression.c, calculate_delim).
func setBlock(s *setSpec, lines, elements []string) block {
	bl := block{head: s.keyword() + " " + s.name, lines: lines, elements: elements}
	if len(s.key) == 1 && s.key[0].typ.Name == nftables.TypeMark.Name {
		bl.perLine = 5
	}
	return bl
}

// elementsText is a set's elements as nft prints them between "elements = { " and " }".
func (bl block) elementsText() string {
	var b strings.Builder
	for i, e := range bl.elements {
		switch {
		case i == 0:
		case bl.perLine > 0 && i%bl.perLine != 0:
			b.WriteString(", ")
		default:
			b.WriteString(",\n\t\t\t     ")
		}
		b.WriteString(e)
	}
	return b.String()
}

// render prints a table as nft 1.0.6 lists it (`nft list table ip kuport`): sets first, then
// chains, each followed by a blank line but the last; a set's elements one per line.
func render(blocks []block) string {
	var b strings.Builder
	b.WriteString("table " + tableFamilyName + " " + tableName + " {\n")
	for i, bl := range blocks {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString("\t" + bl.head + " {\n")
		for _, l := range bl.lines {
			b.WriteString("\t\t" + l + "\n")
		}
		if len(bl.elements) > 0 {
			b.WriteString("\t\telements = { " + bl.elementsText() + " }\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// Render returns the nftables table planned from a program, as `nft list table ip kuport`
// (nft 1.0.6) prints it once applied, with every "counter packets N bytes M" normalised to
// "counter" and each set's elements sorted (nft prints them in hash order): tab
// indentation, the sets, then chains kup-pre, kup-post, kup-mangle, kup-count-in, kup-steer
// and kup-count-out, then each return mark's two chains by mark (nft lists those in the
// order they were added). A program with no valid entry renders as "" (Apply removes the table).
// Entries that fail validation are left out; Apply reports them.
func Render(p *kuportv1.NodeProgram) string {
	t, _ := planTable(p)
	return t.text()
}

func (t *table) text() string {
	if t.empty() {
		return ""
	}
	l := t.layout
	var blocks []block
	for _, s := range l.sets {
		blocks = append(blocks, setBlock(s, s.header(), elementLines(s, t.elems[s.name], func(elem) bool { return true })))
	}
	for _, c := range l.chains {
		bl := block{head: "chain " + c.name, lines: c.header()}
		for _, r := range t.chainRules(c.name) {
			bl.lines = append(bl.lines, r.text)
		}
		blocks = append(blocks, bl)
	}
	return render(blocks)
}
