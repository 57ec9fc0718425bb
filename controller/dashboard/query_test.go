package dashboard

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// manyMappings is labSource with n more mappings demo/bulk-NNNN, every tenth refused for a
// port conflict.
func manyMappings(a Agents, n int) *Source {
	src := labSource(a)
	base := src.PortMaps()
	bulk := make([]*v1alpha1.PortMap, 0, n)
	for i := range n {
		pm := &v1alpha1.PortMap{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: fmt.Sprintf("bulk-%04d", i)},
			Spec: v1alpha1.PortMapSpec{ClassName: "public", Protocol: v1alpha1.ProtocolTCP, Port: int32(10000 + i)}}
		programmed := metav1.Condition{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllNodesReady}
		if i%10 == 0 {
			programmed = metav1.Condition{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonPortConflict, Message: fmt.Sprintf("port %d is taken by demo/other", 10000+i)}
		}
		pm.Status.Conditions = []metav1.Condition{
			{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid}, programmed}
		bulk = append(bulk, pm)
	}
	src.PortMaps = func() []*v1alpha1.PortMap { return append(append([]*v1alpha1.PortMap(nil), base...), bulk...) }
	return src
}

// TestQuery: filters and paging of /state, and the overview's counts over all.
func TestQuery(t *testing.T) {
	s := New()
	s.SetSource(manyMappings(judgingAgents{&fakeAgents{}}, 1000))
	now := time.Unix(1_800_000_000, 0)
	parse := func(raw string) Query {
		v, err := url.ParseQuery(raw)
		require.NoError(t, err)
		q, err := ParseQuery(v)
		require.NoError(t, err)
		return q
	}

	st := s.Query(now, Query{})
	assert.Equal(t, 1002, st.Total)
	assert.Len(t, st.Mappings, defaultLimit)
	assert.Equal(t, 1002, st.Overview.Mappings)
	assert.Equal(t, map[string]int{v1alpha1.ReasonPortConflict: 100}, st.Overview.Refused)
	assert.Equal(t, 900, st.Overview.Programmed)
	assert.Equal(t, 2, st.Overview.Waiting, "demo/remote-udp waits for worker-b, demo/new has no status")
	assert.Equal(t, 1, st.Overview.Unanswered)
	assert.Equal(t, 2, st.Overview.Connected)
	assert.Equal(t, 1, st.Overview.Acknowledged, "worker-b acknowledged 4 of 5")
	require.NotEmpty(t, st.Overview.Problems)
	assert.Equal(t, Problem{Kind: ProblemNodeNotAcked, Node: "worker-b", Message: "acknowledged program version 4, current is 5"},
		st.Overview.Problems[0], "nodes first")
	assert.Equal(t, ProblemUnanswered, st.Overview.Problems[1].Kind)
	assert.Equal(t, Problem{Kind: ProblemRefused, Namespace: "demo", Name: "bulk-0000", Reason: v1alpha1.ReasonPortConflict,
		Message: "port 10000 is taken by demo/other"}, st.Overview.Problems[2])
	assert.Equal(t, 102, st.Overview.ProblemsTotal)

	st = s.Query(now, parse("q=BULK-0421"))
	require.Equal(t, 1, st.Total)
	assert.Equal(t, "bulk-0421", st.Mappings[0].Name)
	st = s.Query(now, parse("state=refused&offset=90&limit=20"))
	assert.Equal(t, 100, st.Total)
	require.Len(t, st.Mappings, 10)
	assert.Equal(t, "bulk-0900", st.Mappings[0].Name)
	st = s.Query(now, parse("node=worker-b"))
	assert.Equal(t, 1, st.Total, "worker-b carries demo/remote-udp only")
	st = s.Query(now, parse("state=unanswered"))
	require.Equal(t, 1, st.Total)
	assert.Equal(t, "remote-udp", st.Mappings[0].Name)
	st = s.Query(now, parse("state=problem&namespace=demo&class=public"))
	assert.Equal(t, 101, st.Total)
	assert.Equal(t, 0, s.Query(now, parse("class=other")).Total)

	for _, bad := range []string{"state=broken", "offset=-1", "limit=501", "limit=x"} {
		v, _ := url.ParseQuery(bad)
		_, err := ParseQuery(v)
		assert.Error(t, err, bad)
	}
}
