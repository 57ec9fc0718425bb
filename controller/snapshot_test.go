package controller

import (
	"testing"

	"github.com/stretchr/testify/assert"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/compile"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

func pm(name string) *v1alpha1.PortMap {
	return &v1alpha1.PortMap{ObjectMeta: metav1.ObjectMeta{Namespace: "games", Name: name}}
}

func TestSetPortMap(t *testing.T) {
	c := &Controller{snap: &compile.Snapshot{}, pmAt: map[types.NamespacedName]int{}}
	key := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "games", Name: n} }
	a, b, c2 := pm("a"), pm("b"), pm("c")
	c.setPortMap(key("a"), a)
	c.setPortMap(key("b"), b)
	c.setPortMap(key("c"), c2)
	a2 := pm("a")
	c.setPortMap(key("a"), a2)
	assert.Equal(t, []*v1alpha1.PortMap{a2, b, c2}, c.snap.PortMaps, "an update replaces in place")
	c.setPortMap(key("a"), nil)
	assert.Equal(t, []*v1alpha1.PortMap{c2, b}, c.snap.PortMaps, "a delete moves the last into its place")
	assert.Equal(t, map[types.NamespacedName]int{key("c"): 0, key("b"): 1}, c.pmAt)
	c.setPortMap(key("gone"), nil)
	c.setPortMap(key("b"), nil)
	c.setPortMap(key("c"), nil)
	assert.Empty(t, c.snap.PortMaps)
	assert.Empty(t, c.pmAt)
}

func TestChangesTake(t *testing.T) {
	var ch changes
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "games", Name: "web-x1",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}}
	ch.slice(cache.DeletedFinalStateUnknown{Key: "games/web-x1", Obj: slice})
	ch.portMap(pm("a"))
	ch.portMap(cache.DeletedFinalStateUnknown{Key: "games/b", Obj: pm("b")})
	ch.class(&v1alpha1.PortMapClass{ObjectMeta: metav1.ObjectMeta{Name: "public"}})
	pms, svcs, classes, others := ch.take()
	assert.Equal(t, map[types.NamespacedName]bool{{Namespace: "games", Name: "a"}: true, {Namespace: "games", Name: "b"}: true}, pms)
	assert.Equal(t, map[types.NamespacedName]bool{{Namespace: "games", Name: "web"}: true}, svcs)
	assert.Equal(t, map[types.NamespacedName]bool{{Name: "public"}: true}, classes, "a class is recorded by name")
	assert.False(t, others)
	ch.other()
	pms, _, _, others = ch.take()
	assert.Nil(t, pms, "taken once")
	assert.True(t, others)
}

func TestAgentsChanged(t *testing.T) {
	st := &kuportv1.NodeState{}
	a := map[string]*compile.AgentState{"edge-a": {State: st}}
	assert.False(t, agentsChanged(a, map[string]*compile.AgentState{"edge-a": {State: st}}), "the same state compiles nothing new")
	assert.True(t, agentsChanged(a, map[string]*compile.AgentState{"edge-a": {State: &kuportv1.NodeState{}}}))
	assert.True(t, agentsChanged(a, map[string]*compile.AgentState{}))
}
