// Package dashboard serves the controller's read-only web page (docs/dashboard.md): "/" is
// one self-contained page (no CDN, no build step) that polls "/state" (State: counts and
// problems over every mapping, nodes, links, classes and a searched, filtered page of
// mappings) or "/mapping" (MappingDetail: one mapping with its path) every second and
// draws them, with its path and charts as inline SVG. Run samples the counters for the rates
// and keeps a bounded 15-minute history.
//
// It reads the agent registry and the controller's informer caches through Source and
// writes nothing anywhere: no API call, no kernel, no decision. Which entry, link or node
// belongs to a mapping comes from compile's index, which entry a counter measures from
// metrics.Counted (shared with the Prometheus metrics), and whether requests go unanswered
// from the registry's verdicts (Judge), all through the Agents interface.
package dashboard

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/compile"
	"kuport.wlz.li/kuport/controller/metrics"
)

//go:embed index.html
var indexHTML []byte

// Agents is the agent side the page reads; *agents.Registry satisfies it.
type Agents interface {
	metrics.Source
	// Agents returns what each node's agent last told (its interfaces and underlay).
	Agents() map[string]*compile.AgentState
}

// Judge is an Agents that also judges whether each mapping's requests go unanswered on a
// node (*agents.Registry does); the page shows no unanswered row for an Agents without it.
type Judge interface {
	Unanswered(node string) map[string][]agents.InterfaceVerdict
}

// Source is what the page shows while this replica leads.
type Source struct {
	Agents Agents
	// PortMaps lists the cached PortMaps.
	PortMaps func() []*v1alpha1.PortMap
	// Classes lists the cached PortMapClasses.
	Classes func() []*v1alpha1.PortMapClass
}

// sampleInterval is how often Run reads the counters: a counter moves when its agent
// reports (every 5 s by default, 2 s in the lab), and Run times each move to within one
// interval, whenever and however often the page is read.
const sampleInterval = time.Second

// sampleMaxShare bounds the time Run spends sampling: at 10,000 mappings a sample takes a
// few hundred milliseconds (BENCHMARKS.md), so the interval grows to keep within a tenth.
const sampleMaxShare = 10

// idleAfter is how long after the last read of the state Run keeps sampling: an unwatched
// dashboard reads nothing.
const idleAfter = time.Minute

// Server serves the page and its state. Safe for concurrent use.
type Server struct {
	mu         sync.Mutex
	src        *Source
	lastRead   time.Time // of the state
	lastSample time.Time // Run's latest
	// gap is how long after lastSample the next sample is due while the page is read:
	// sampleMaxShare of the time goes to sampling, at most one every sampleInterval.
	gap time.Duration

	// series holds Run's latest sample: rates.rate gives its rates, by counterKey and
	// linkRateKey.
	series rates
	hist   history
}

// New returns a Server with no Source: it says the replica does not lead until SetSource.
func New() *Server { return &Server{} }

// SetSource sets what the page shows: the current leadership term's registry and caches,
// or nil while this replica does not lead.
func (s *Server) SetSource(src *Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.src = src
}

// Run samples the counters until ctx ends: every sampleInterval (longer at scale, see
// sampleMaxShare) while the state has been read within idleAfter, else every historyStep
// for the history. The rates State reports
// come from these samples.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(sampleInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sample(now)
		}
	}
}

// sample feeds one reading of every counter to the rates and the history when one is due:
// every historyStep, and while the page is read every gap. With no source it reads nothing
// and the rates and history start over.
func (s *Server) sample(now time.Time) {
	s.mu.Lock()
	since := now.Sub(s.lastSample)
	src, due := s.src, since >= historyStep || (now.Sub(s.lastRead) < idleAfter && since >= s.gap-sampleInterval/2)
	s.mu.Unlock()
	if !due {
		return
	}
	start := time.Now()
	readings := map[string]reading{}
	var rows *sampleRows
	if src != nil {
		rows = readSampleRows(src.Agents, readings)
	}
	s.series.observe(readings, now)
	s.hist.record(rows.historyValues(s.series.rate), now)
	s.mu.Lock()
	s.lastSample = now
	s.gap = min(max(sampleMaxShare*time.Since(start), sampleInterval), historyStep)
	s.mu.Unlock()
}

// ServeHTTP serves "/" (the page), "/state" (State as JSON, the query's page of
// mappings: see ParseQuery) and "/mapping?namespace=&name=" (one mapping with its path,
// as MappingDetail), GET and HEAD only. None lies under /api/: the controller authorizes
// each path as kube-apiserver would (controller/webauth), and its bootstrap ClusterRole
// system:discovery lets every authenticated user get /api/*.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(indexHTML)
	case "/state":
		q, err := ParseQuery(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, s.Query(time.Now(), q))
	case "/mapping":
		key := types.NamespacedName{Namespace: r.URL.Query().Get("namespace"), Name: r.URL.Query().Get("name")}
		d := s.Mapping(time.Now(), key)
		if d.Leader && d.Mapping == nil {
			http.Error(w, "no PortMap "+key.String(), http.StatusNotFound)
			return
		}
		writeJSON(w, d)
	default:
		http.NotFound(w, r)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	_ = enc.Encode(v)
}

// State reads the Source at now for the query's first page of every mapping.
func (s *Server) State(now time.Time) *State { return s.Query(now, Query{}) }

// Query reads the Source at now, with the rates of Run's latest sample, for q's page of
// mappings; it also keeps Run sampling every sampleInterval for idleAfter.
func (s *Server) Query(now time.Time, q Query) *State {
	q = q.withDefaults()
	st := &State{Time: now.UTC(), Classes: []Class{}, Nodes: []Node{}, Links: []Link{}, Mappings: []Mapping{}, Query: q,
		Overview: Overview{Refused: map[string]int{}, Problems: []Problem{}}}
	src, rate := s.read(now)
	if src == nil {
		return st
	}
	st.Leader = true
	snap := readSnapshot(src.Agents)
	st.Nodes = snap.nodeRows()
	st.Links = s.linkRows(snap, rate)
	for _, c := range src.Classes() {
		st.Classes = append(st.Classes, class(c))
	}
	slices.SortFunc(st.Classes, func(a, b Class) int { return strings.Compare(a.Name, b.Name) })

	all := allMappings(src, snap)
	st.Overview = overview(all, st.Nodes, st.Links)
	matched := slices.DeleteFunc(all, func(m Mapping) bool { return !q.matches(m) })
	st.Total = len(matched)
	page := matched[min(q.Offset, len(matched)):min(q.Offset+q.Limit, len(matched))]
	wanted := make(map[types.NamespacedName]bool, len(page))
	for _, m := range page {
		wanted[types.NamespacedName{Namespace: m.Namespace, Name: m.Name}] = true
	}
	snap.count(wanted)
	for _, m := range page {
		st.Mappings = append(st.Mappings, s.withCounters(m, snap, rate))
	}
	return st
}

// read returns the source and the rates of the latest sample, and marks the state read at
// now.
func (s *Server) read(now time.Time) (*Source, rateFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastRead = now
	return s.src, s.series.rate
}

// allMappings lists every cached PortMap with what the snapshot holds of it, but not its
// counters, sorted by namespace and name.
func allMappings(src *Source, snap *snapshot) []Mapping {
	pms := src.PortMaps()
	out := make([]Mapping, 0, len(pms))
	for _, pm := range pms {
		m := mapping(pm)
		key := types.NamespacedName{Namespace: pm.Namespace, Name: pm.Name}
		for _, mi := range snap.index[key] { // every node's index names the same serving node
			m.ServingNode = mi.ServingNode
			break
		}
		m.Nodes = snap.carriers(key)
		m.Unanswered = snap.unanswered[key]
		slices.SortFunc(m.Unanswered, func(a, b Unanswered) int {
			return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Interface, b.Interface))
		})
		if m.Unanswered == nil {
			m.Unanswered = []Unanswered{}
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Mapping) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}

// withCounters adds m's counters, with their rates, and its history.
func (s *Server) withCounters(m Mapping, snap *snapshot, rate rateFunc) Mapping {
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
	m.Counters = slices.Clone(snap.counters[key])
	for i := range m.Counters {
		m.Counters[i].Rate = rate(counterKey(key, m.Counters[i]), m.Counters[i].reading())
	}
	slices.SortFunc(m.Counters, func(a, b Counter) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Rule, b.Rule), strings.Compare(a.Direction, b.Direction))
	})
	if m.Counters == nil {
		m.Counters = []Counter{}
	}
	m.History = s.history(mappingHistoryKey(key, "in"), mappingHistoryKey(key, "out"))
	return m
}

// history returns the History of the in and out series keyed so, nil while there is none.
func (s *Server) history(in, out string) *History {
	series, end := s.hist.get(in, out)
	if series[0] == nil && series[1] == nil {
		return nil
	}
	return &History{StepSeconds: historyStep.Seconds(), End: end.UTC(), In: series[0], Out: series[1]}
}

// linkRows lists snap's links with their rates and history.
func (s *Server) linkRows(snap *snapshot, rate rateFunc) []Link {
	out := make([]Link, 0, len(snap.links))
	for _, l := range snap.links {
		l.Ends = slices.Clone(l.Ends)
		for i := range l.Ends {
			e := &l.Ends[i]
			e.RxPerSecond = linkRate(rate, *e, "rx")
			e.TxPerSecond = linkRate(rate, *e, "tx")
			e.TxErrorsPerSecond = linkRate(rate, *e, "txErrors")
			e.History = s.history(linkHistoryKey(*e, "in"), linkHistoryKey(*e, "out"))
		}
		out = append(out, l)
	}
	return out
}

// counterKey names mapping's counter c across samples: a rule's forwarded rows differ by
// direction only.
func counterKey(mapping types.NamespacedName, c Counter) string {
	return c.Node + " " + mapping.String() + "/" + c.Rule + " " + c.Direction
}

// linkRateKey names one statistic of a link end across samples.
func linkRateKey(e LinkEnd, stat string) string {
	return "link " + e.Node + " " + e.Device + " " + stat
}

// linkStats are the statistics of a link end that have rates.
var linkStats = []string{"rx", "tx", "txErrors"}

// reading is the end's statistic stat (one of linkStats) as a counter of packets.
func (e LinkEnd) reading(stat string) reading {
	switch stat {
	case "rx":
		return reading{packets: e.RxPackets}
	case "tx":
		return reading{packets: e.TxPackets}
	default:
		return reading{packets: e.TxErrors}
	}
}

// linkRate is the packet rate of the end's statistic stat: unknown until its node reports it.
func linkRate(rate rateFunc, e LinkEnd, stat string) *float64 {
	if !e.Reported {
		return nil
	}
	return rate(linkRateKey(e, stat), e.reading(stat)).PacketsPerSecond
}

func (c Counter) reading() reading { return reading{packets: c.Packets, bytes: c.Bytes} }

// rateFunc is rates.rate of the latest sample.
type rateFunc func(key string, now reading) Rate

// mappingHistoryKey and linkHistoryKey name the history's series: dir is "in" or "out".
func mappingHistoryKey(m types.NamespacedName, dir string) string {
	return "m " + m.String() + " " + dir
}
func linkHistoryKey(e LinkEnd, dir string) string { return "l " + e.Node + " " + e.Device + " " + dir }

// sampleRows is what a sample keeps of one read of the counters for the history, once
// their readings are observed: each mapping's client-facing forwarded rows (forwarded, not
// over a link) by direction, and the link ends. A row at 0 keeps no key (its rate is 0):
// a sample of an idle cluster makes no string nor row per counter.
type sampleRows struct {
	mappings map[types.NamespacedName]*[2]forwardedRows // [0] in, [1] out
	links    []Link
}

// forwardedRows are one direction's rows of a mapping: the keys and readings of those above
// 0, and whether any read 0.
type forwardedRows struct {
	moving []keyedReading
	idle   bool
}

type keyedReading struct {
	key string
	reading
}

// readSampleRows reads every node's counters (readCounts, counted) once: each counter and
// link statistic above 0 goes into readings by its rate key, and sampleRows keeps what
// historyValues sums.
func readSampleRows(a Agents, readings map[string]reading) *sampleRows {
	snap := readCounts(a)
	rows := &sampleRows{mappings: map[types.NamespacedName]*[2]forwardedRows{}, links: snap.links}
	snap.counted(nil, func(m types.NamespacedName, c Counter) {
		dirs := rows.mappings[m]
		if dirs == nil {
			dirs = &[2]forwardedRows{}
			rows.mappings[m] = dirs
		}
		v := c.reading()
		var key string
		if !v.zero() {
			key = counterKey(m, c)
			readings[key] = v
		}
		if !c.forwarded || c.overLink {
			return
		}
		d := &dirs[0]
		if c.Direction == metrics.DirectionOut {
			d = &dirs[1]
		}
		if v.zero() {
			d.idle = true
		} else {
			d.moving = append(d.moving, keyedReading{key, v})
		}
	})
	for _, l := range snap.links {
		for _, e := range l.Ends {
			for _, stat := range linkStats {
				if v := e.reading(stat); e.Reported && !v.zero() {
					readings[linkRateKey(e, stat)] = v
				}
			}
		}
	}
	return rows
}

// historyValues sums each mapping's rates of the packets its accepting interfaces forward
// in (from clients) and out (to them), and takes each link end's rx and tx packet rates;
// a sum of no known rate is unknown (NaN). None for nil rows (no source).
func (rows *sampleRows) historyValues(rate rateFunc) map[string]float64 {
	out := map[string]float64{}
	if rows == nil {
		return out
	}
	for m, dirs := range rows.mappings {
		for i, dir := range []string{metrics.DirectionIn, metrics.DirectionOut} {
			var sum *float64
			if dirs[i].idle {
				sum = ptr(0.0)
			}
			for _, r := range dirs[i].moving {
				if pps := rate(r.key, r.reading).PacketsPerSecond; pps != nil {
					sum = ptr(deref(sum) + *pps)
				}
			}
			out[mappingHistoryKey(m, dir)] = orNaN(sum)
		}
	}
	for _, l := range rows.links {
		for _, e := range l.Ends {
			out[linkHistoryKey(e, "in")] = orNaN(linkRate(rate, e, "rx"))
			out[linkHistoryKey(e, "out")] = orNaN(linkRate(rate, e, "tx"))
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

func orNaN(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

func condition(c *metav1.Condition) Condition {
	if c == nil {
		return Condition{Status: "Unknown"}
	}
	return Condition{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
}

func class(c *v1alpha1.PortMapClass) Class {
	return Class{Name: c.Name,
		ServingMode: string(c.Spec.ServingMode.OrDefault()),
		ReturnPath:  string(c.Spec.ReturnPath.Mode.OrDefault()),
		Ready:       condition(meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ClassConditionReady)),
		Nodes:       slices.Sorted(maps.Keys(c.Spec.Nodes)),
	}
}

func mapping(pm *v1alpha1.PortMap) Mapping {
	m := Mapping{Namespace: pm.Namespace, Name: pm.Name, Class: pm.Spec.ClassName, Protocol: string(pm.Spec.Protocol),
		Ports: pm.Status.Ports, Endpoint: pm.Status.Endpoint, Published: pm.Status.Published,
		Accepted:   condition(meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionAccepted)),
		Programmed: condition(meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed)),
	}
	m.State = mappingState(m.Accepted, m.Programmed)
	if m.Ports == "" {
		m.Ports = fmt.Sprint(pm.Spec.Port)
		if pm.Spec.EndPort != nil {
			m.Ports += fmt.Sprintf("-%d", *pm.Spec.EndPort)
		}
	}
	if m.Published == nil {
		m.Published = []v1alpha1.PublishedAddress{}
	}
	return m
}
