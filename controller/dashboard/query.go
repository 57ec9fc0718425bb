package dashboard

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// A mapping's State, from its conditions as status has them.
const (
	// StateProgrammed: Programmed is True.
	StateProgrammed = "programmed"
	// StateRefused: Accepted is False, or Programmed is False for a reason other than
	// waiting for nodes (NodeNotReady): the controller will not program it as it is.
	StateRefused = "refused"
	// StateWaiting: Programmed is False with NodeNotReady, or not written yet.
	StateWaiting = "waiting"
)

// Filter values of Query.State besides the states: StateUnanswered matches a mapping with
// an unanswered node and interface, StateProblem one refused or unanswered.
const (
	StateUnanswered = "unanswered"
	StateProblem    = "problem"
)

// Paging limits of Query.Limit.
const (
	defaultLimit = 50
	maxLimit     = 500
)

// Query selects and pages the mappings of /state. Every set field must match.
type Query struct {
	// Search matches a mapping whose "namespace/name" contains it, ignoring case.
	Search    string `json:"search,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	Class     string `json:"class,omitempty"`
	// Node matches a mapping some node's program carries, or whose endpoint is there.
	Node string `json:"node,omitempty"`
	// State is one of StateProgrammed, StateRefused, StateWaiting, StateUnanswered and
	// StateProblem.
	State  string `json:"state,omitempty"`
	Offset int    `json:"offset"`
	// Limit is at most maxLimit; 0 is defaultLimit.
	Limit int `json:"limit"`
}

var states = []string{StateProgrammed, StateRefused, StateWaiting, StateUnanswered, StateProblem}

// ParseQuery reads a Query from URL parameters q, namespace, name, class, node, state,
// offset and limit; a bad value is an error naming it.
func ParseQuery(v url.Values) (Query, error) {
	q := Query{Search: v.Get("q"), Namespace: v.Get("namespace"), Name: v.Get("name"), Class: v.Get("class"),
		Node: v.Get("node"), State: v.Get("state")}
	if q.State != "" && !slices.Contains(states, q.State) {
		return Query{}, fmt.Errorf("state %q: want one of %s", q.State, strings.Join(states, ", "))
	}
	for _, p := range []struct {
		name string
		max  int
		to   *int
	}{{"offset", int(^uint(0) >> 1), &q.Offset}, {"limit", maxLimit, &q.Limit}} {
		s := v.Get(p.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > p.max {
			return Query{}, fmt.Errorf("%s %q: want a whole number from 0 to %d", p.name, s, p.max)
		}
		*p.to = n
	}
	return q, nil
}

func (q Query) withDefaults() Query {
	if q.Limit <= 0 || q.Limit > maxLimit {
		q.Limit = defaultLimit
	}
	q.Offset = max(q.Offset, 0)
	return q
}

func (q Query) matches(m Mapping) bool {
	switch {
	case q.Search != "" && !strings.Contains(strings.ToLower(m.Namespace+"/"+m.Name), strings.ToLower(q.Search)):
		return false
	case q.Namespace != "" && m.Namespace != q.Namespace,
		q.Name != "" && m.Name != q.Name,
		q.Class != "" && m.Class != q.Class:
		return false
	case q.Node != "" && !slices.Contains(m.Nodes, q.Node) && (m.Endpoint == nil || m.Endpoint.Node != q.Node):
		return false
	}
	switch q.State {
	case "":
		return true
	case StateUnanswered:
		return len(m.Unanswered) > 0
	case StateProblem:
		return m.State == StateRefused || len(m.Unanswered) > 0
	}
	return m.State == q.State
}

// mappingState sums a mapping's conditions up.
func mappingState(accepted, programmed Condition) string {
	switch {
	case programmed.Status == "True":
		return StateProgrammed
	case accepted.Status == "False",
		programmed.Status == "False" && programmed.Reason != v1alpha1.ReasonNodeNotReady:
		return StateRefused
	}
	return StateWaiting
}

// refusal is the condition saying why a refused mapping is refused.
func refusal(m Mapping) Condition {
	if m.Accepted.Status == "False" {
		return m.Accepted
	}
	return m.Programmed
}
