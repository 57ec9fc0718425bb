package dashboard

import "fmt"

// maxProblems is how many problems the overview lists; Overview.ProblemsTotal counts all.
const maxProblems = 200

// Overview is the counts over every mapping, node and link, and the problems, most
// pressing first: nodes, links, unanswered mappings, refused mappings.
type Overview struct {
	Mappings   int `json:"mappings"`
	Programmed int `json:"programmed"`
	// Refused counts the refused mappings by reason.
	Refused    map[string]int `json:"refused"`
	Waiting    int            `json:"waiting"`
	Unanswered int            `json:"unanswered"`
	Nodes      int            `json:"nodes"`
	Connected  int            `json:"connected"`
	// Acknowledged counts the connected nodes that acknowledged their current program.
	Acknowledged int `json:"acknowledged"`
	Links        int `json:"links"`
	// LinksErrorsRising counts the links one of whose ends' tx_errors rose within the rate
	// window.
	LinksErrorsRising int       `json:"linksErrorsRising"`
	Problems          []Problem `json:"problems"`
	ProblemsTotal     int       `json:"problemsTotal"`
}

// Kinds of Problem.
const (
	ProblemNodeDisconnected = "NodeDisconnected"
	ProblemNodeNotAcked     = "NodeNotAcknowledged"
	ProblemLinkTxErrors     = "LinkTxErrorsRising"
	ProblemUnanswered       = "RequestsUnanswered"
	ProblemRefused          = "Refused"
)

// Problem is one thing an operator should look at, about a mapping (Namespace and Name) or
// a node (Node, and Link for a link end's device).
type Problem struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	Node      string `json:"node,omitempty"`
	Link      string `json:"link,omitempty"`
	// Reason is the condition's reason for a refused mapping.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
}

// overview counts mappings (all of them, with their states and unanswered verdicts), nodes
// and links (with their rates) and lists their problems.
func overview(mappings []Mapping, nodes []Node, links []Link) Overview {
	o := Overview{Mappings: len(mappings), Nodes: len(nodes), Links: len(links), Refused: map[string]int{}}
	var problems []Problem
	for _, n := range nodes {
		switch {
		case !n.Connected:
			problems = append(problems, Problem{Kind: ProblemNodeDisconnected, Node: n.Name,
				Message: fmt.Sprintf("the agent is not connected; it acknowledged program version %d of %d", n.AckedVersion, n.ProgramVersion)})
		case n.AckedVersion != n.ProgramVersion:
			o.Connected++
			problems = append(problems, Problem{Kind: ProblemNodeNotAcked, Node: n.Name,
				Message: fmt.Sprintf("acknowledged program version %d, current is %d", n.AckedVersion, n.ProgramVersion)})
		default:
			o.Connected++
			o.Acknowledged++
		}
	}
	for _, l := range links {
		rising := false
		for _, e := range l.Ends {
			if e.TxErrorsPerSecond != nil && *e.TxErrorsPerSecond > 0 {
				rising = true
				problems = append(problems, Problem{Kind: ProblemLinkTxErrors, Node: e.Node, Link: e.Device,
					Message: fmt.Sprintf("link %s to %s (class %s): tx_errors %d, rising %.1f/s", e.Device, e.PeerNode, l.Class, e.TxErrors, *e.TxErrorsPerSecond)})
			}
		}
		if rising {
			o.LinksErrorsRising++
		}
	}
	var refused []Problem
	for _, m := range mappings {
		switch m.State {
		case StateProgrammed:
			o.Programmed++
		case StateWaiting:
			o.Waiting++
		case StateRefused:
			c := refusal(m)
			o.Refused[c.Reason]++
			refused = append(refused, Problem{Kind: ProblemRefused, Namespace: m.Namespace, Name: m.Name,
				Reason: c.Reason, Message: c.Message})
		}
		if len(m.Unanswered) > 0 {
			o.Unanswered++
			u := m.Unanswered[0]
			problems = append(problems, Problem{Kind: ProblemUnanswered, Namespace: m.Namespace, Name: m.Name, Node: u.Node,
				Message: fmt.Sprintf("%d requests and no reply on %s/%s since %s", u.Requests, u.Node, u.Interface, u.Since.Format("15:04:05 UTC"))})
		}
	}
	problems = append(problems, refused...)
	o.ProblemsTotal = len(problems)
	o.Problems = problems[:min(len(problems), maxProblems)]
	if o.Problems == nil {
		o.Problems = []Problem{}
	}
	return o
}
