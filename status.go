package tierlimit

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
)

// The status endpoint (status.path): for clients whose resolved IP is in
// status.allowedIPs, the plugin answers GET/HEAD <path> with JSON (layers,
// their counters since the process started, the live keys) and
// <path>/metrics with the Prometheus text format (metrics.go), and POST
// <path>/reset clears one key of one layer (reset.go). Every other
// request, including those paths from any other client, is an ordinary
// request. Status requests are not charged to any layer.

// Paging bounds of the key listing.
const (
	defaultKeyLimit = 100
	maxKeyLimit     = 1000
)

const metricsSuffix = "/metrics"

// serveStatus answers the request if it is for the status endpoint from an
// allowed client and reports whether it did. Called only when status.path is
// set; the path is compared first, in a frame of its own, so that other
// requests cost one string prefix test (doc.go: frames).
func serveStatus(p *Plugin, rw http.ResponseWriter, req *http.Request) bool {
	return strings.HasPrefix(req.URL.Path, p.status.path) && serveStatusPage(p, rw, req)
}

// serveStatusPage is serveStatus for a request whose path starts with
// status.path.
func serveStatusPage(p *Plugin, rw http.ResponseWriter, req *http.Request) bool {
	path := req.URL.Path
	rest := path[len(p.status.path):]
	if rest != "" && rest != metricsSuffix && rest != resetSuffix {
		return false
	}

	if !p.statusOpenTo(req) {
		return false
	}

	h := rw.Header()
	h["Cache-Control"] = answer.NoStore

	if rest == resetSuffix {
		serveReset(p, rw, req)
		return true
	}

	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		h["Allow"] = []string{"GET, HEAD"}
		writeStatus(rw, req, http.StatusMethodNotAllowed, answer.JSONContentType, []byte(`{"error":"method not allowed"}`))

		return true
	}

	now := p.now().UnixNano()

	if rest == metricsSuffix {
		writeStatus(rw, req, http.StatusOK, metricsContentType, []byte(p.metricsText(now)))
		return true
	}

	body, code := p.statusJSON(req, now)
	writeStatus(rw, req, code, answer.JSONContentType, body)

	return true
}

// statusOpenTo reports whether the request's client, resolved as the limiter
// resolves it (trusted proxies, trustedHops), is in status.allowedIPs.
func (p *Plugin) statusOpenTo(req *http.Request) bool {
	return request.ClientIn(p.ips, req, p.status.allowed)
}

// writeStatus writes a status response; HEAD gets the headers only.
func writeStatus(rw http.ResponseWriter, req *http.Request, code int, contentType []string, body []byte) {
	h := rw.Header()
	h["Content-Type"] = contentType
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	rw.WriteHeader(code)

	if req.Method != http.MethodHead {
		_, _ = rw.Write(body)
	}
}

// countingRule is what the status page's counts mean, on the page itself.
const countingRule = "a request refused by any layer spends nothing in any layer: count is what a key was charged, refused what its window (or its block) refused"

// The JSON document. Only exported, tagged fields: Yaegi's encoding/json
// would otherwise show unexported ones.
type statusReport struct {
	Middleware    string `json:"middleware"`
	Store         string `json:"store"`
	RedisFallback bool   `json:"redisFallback"`
	// RedisFallbackReason says why, in one word, while RedisFallback.
	RedisFallbackReason string        `json:"redisFallbackReason,omitempty"`
	Evictions           int64         `json:"evictions"`
	Counting            string        `json:"counting"`
	Layers              []statusLayer `json:"layers"`
	Keys                statusKeys    `json:"keys"`
}

type statusLayer struct {
	Name        string `json:"name"`
	Points      int64  `json:"points"`
	Duration    string `json:"duration"`
	Algorithm   string `json:"algorithm"`
	Burst       int64  `json:"burst,omitempty"` // tokenbucket
	TrackedKeys int    `json:"trackedKeys"`
	Allowed     int64  `json:"allowed"`
	Refused     int64  `json:"refused"`
	// CostFrom is a costFrom route's settlement (meter.go); nil elsewhere.
	CostFrom *statusMeter `json:"costFrom,omitempty"`
}

// statusMeter is what a costFrom route's layer holds and settled since the
// process started: the requests holding a reservation now, the points
// their responses reported, and the responses that reported none.
type statusMeter struct {
	Source     string `json:"source"`
	Reserve    int64  `json:"reserve"`
	Reserved   int64  `json:"reserved"`
	Settled    int64  `json:"settledPoints"`
	Unreported int64  `json:"unreported"`
}

type statusKeys struct {
	Total  int         `json:"total"`
	Offset int         `json:"offset"`
	Limit  int         `json:"limit"`
	Items  []statusKey `json:"items"`
}

type statusKey struct {
	Layer     string `json:"layer"`
	Key       string `json:"key"`
	Count     int64  `json:"count"`
	Limit     int64  `json:"limit"`
	Limited   bool   `json:"limited"`
	Refused   int64  `json:"refused"`
	Reset     string `json:"reset"`
	ResetUnix int64  `json:"resetUnix"`
}

type statusError struct {
	Error     string `json:"error"`
	Parameter string `json:"parameter"`
}

// keyQuery is the listing's filter and page, from the query string.
type keyQuery struct {
	limited bool   // only keys over their limit
	prefix  string // only keys starting with this
	offset  int
	limit   int
}

// parseKeyQuery reads limited, q, offset and limit; on a bad value it returns
// the parameter's name.
func parseKeyQuery(req *http.Request) (keyQuery, string) {
	q := keyQuery{limit: defaultKeyLimit}
	values := req.URL.Query()

	if v, ok := values["limited"]; ok {
		switch v[0] {
		case "true":
			q.limited = true
		case "false":
		default:
			return q, "limited"
		}
	}

	if v, ok := values["q"]; ok {
		q.prefix = v[0]
	}

	if v, ok := values["offset"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 0 {
			return q, "offset"
		}

		q.offset = n
	}

	if v, ok := values["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 0 || n > maxKeyLimit {
			return q, "limit"
		}

		q.limit = n
	}

	return q, ""
}

// statusJSON returns the status document, or a 400 for a bad query parameter.
func (p *Plugin) statusJSON(req *http.Request, now int64) ([]byte, int) {
	q, bad := parseKeyQuery(req)
	if bad != "" {
		body, _ := json.Marshal(statusError{Error: "invalid query parameter " + bad, Parameter: bad})
		return body, http.StatusBadRequest
	}

	entries, tracked := p.liveKeys(now, q.limited, q.prefix)
	total := len(entries)
	entries = p.firstSorted(entries, pageEnd(q, total))

	report := statusReport{
		Middleware:          p.name,
		Store:               p.status.store,
		RedisFallback:       p.redisFallback(),
		RedisFallbackReason: p.redisFallbackReason(),
		Evictions:           p.memory.Evicted(),
		Counting:            countingRule,
		Layers:              p.statusLayers(tracked),
		Keys:                statusKeys{Total: total, Offset: q.offset, Limit: q.limit, Items: p.statusItems(entries, q.offset)},
	}

	body, err := json.Marshal(report)
	if err != nil {
		return []byte(`{"error":"encoding the status"}`), http.StatusInternalServerError
	}

	return body, http.StatusOK
}

// pageEnd is where the page of the listing ends: offset+limit, within the
// total. Both are bounded below by 0 and limit by maxKeyLimit, so only a huge
// offset can overflow, which means past the end.
func pageEnd(q keyQuery, total int) int {
	if q.offset >= total {
		return 0
	}

	end := q.offset + q.limit
	if end < q.offset || end > total {
		end = total
	}

	return end
}

// statusLayers describes each layer with its counters since the process
// started and the keys its map holds (tracked, aligned with p.layers).
func (p *Plugin) statusLayers(tracked []int) []statusLayer {
	out := make([]statusLayer, 0, len(p.layers))

	for i, l := range p.layers {
		allowed, refused := p.memory.Totals(l.Stats)

		sl := statusLayer{
			Name: l.Name, Points: l.Points, Duration: time.Duration(l.Duration).String(), Algorithm: config.AlgorithmName(l.Algorithm),
			TrackedKeys: tracked[i], Allowed: allowed, Refused: refused,
		}

		if l.Algorithm == algTokenBucket {
			sl.Points = l.Refill
			sl.Burst = l.Points
		}

		if rt := meteredRouteOf(p, l); rt != nil {
			sl.CostFrom = &statusMeter{Source: rt.costFrom.Spec, Reserve: rt.reserve, Reserved: atomic.LoadInt64(&l.Stats.Reserved),
				Settled: atomic.LoadInt64(&l.Stats.Settled), Unreported: atomic.LoadInt64(&l.Stats.Unreported)}
		}

		out = append(out, sl)
	}

	return out
}

// statusItems describes the sorted listing's keys from offset on.
func (p *Plugin) statusItems(entries []liveKey, offset int) []statusKey {
	items := []statusKey{}

	for i := offset; i < len(entries); i++ {
		e := entries[i]
		l := p.layers[e.layer]
		resetUnix := limit.CeilSeconds(e.reset)

		items = append(items, statusKey{
			Layer: l.Name, Key: e.key, Count: e.count, Limit: l.Points, Limited: e.limited, Refused: e.refused,
			Reset: time.Unix(resetUnix, 0).UTC().Format(time.RFC3339), ResetUnix: resetUnix,
		})
	}

	return items
}

// liveKey is a live window as the listing copies it: the index of its layer in
// p.layers, its key, count and reset (Unix nanoseconds), whether its next
// request is refused, and the requests it refused in this window (a refused
// request is not in the count).
type liveKey struct {
	layer   int
	key     string
	count   int64
	reset   int64
	limited bool
	refused int64
}

// liveFilter is what liveKeys copies: the windows live at now, only those
// at their limit when limitedOnly is set, of keys that start with prefix.
type liveFilter struct {
	now         int64
	limitedOnly bool
	prefix      string
}

// liveKeys copies the live windows of the middleware's layers that pass the
// filter, and returns them unsorted with the number of keys each layer's map
// holds (tracked, aligned with p.layers). For the Redis store, the keys Redis
// reported over their limit are merged in, with count points (full) unless the
// memory store (the fallback) knows a higher one.
func (p *Plugin) liveKeys(now int64, limitedOnly bool, prefix string) ([]liveKey, []int) {
	tracked := make([]int, len(p.layers))

	var out []liveKey

	s := p.memory
	f := &liveFilter{now: now, limitedOnly: limitedOnly, prefix: prefix}
	s.Mu.Lock()

	for i, l := range p.layers {
		m := s.Maps[l.Name]
		tracked[i] = len(m)

		if l.Algorithm == algSliding {
			out = appendSliding(out, i, l, m, f)
			continue
		}

		if l.Algorithm == algTokenBucket {
			out = appendBucket(out, i, l, m, f)
			continue
		}

		if l.Algorithm == algConcurrency {
			out = appendHeld(out, i, l, m, f) // inflight.go
			continue
		}

		for key, w := range m {
			if w.Reset > now && w.List == l.List && (!limitedOnly || limit.Full(w.Count, l.Points)) &&
				(prefix == "" || strings.HasPrefix(key, prefix)) {
				out = append(out, liveKey{layer: i, key: key, count: w.Count, reset: w.Reset, limited: limit.Full(w.Count, l.Points), refused: w.Refused})
			}
		}
	}

	s.Mu.Unlock()

	out = p.mergeBlocked(out, s.BlockedKeys(now, p.layers, prefix))

	if rs := p.stores.redis; rs != nil {
		out = p.mergeBlocked(out, rs.Blocked.Snapshot(now, prefix))
	}

	return out, tracked
}

// appendSliding is liveKeys' loop for a sliding layer, under the store's lock.
// A sliding counter holds only allowed requests, so its count never exceeds
// the points: the listing shows the weighted count the layer decides on
// (this window's count plus the previous window's share, limit.SlidingCount),
// and a key is limited when its next request would be refused. A counter
// whose window ended less than a duration ago stands for the window that
// followed it (limit.SlidingAt).
func appendSliding(out []liveKey, i int, l *layer, m map[string]*window, f *liveFilter) []liveKey {
	now, limitedOnly, prefix := f.now, f.limitedOnly, f.prefix
	for key, w := range m {
		if w.Expire <= now || w.List != l.List || (prefix != "" && !strings.HasPrefix(key, prefix)) {
			continue
		}

		prev, count, reset := w.PrevCount, w.Count, w.Reset
		if reset <= now {
			prev, count, reset = limit.SlidingAt(prev, count, reset, now, l.Duration)
		}

		est := limit.SlidingCount(prev, count, 0, reset-now, l.Duration)
		if limit.Full(est, l.Points) || !limitedOnly {
			out = append(out, liveKey{layer: i, key: key, count: est, reset: reset, limited: limit.Full(est, l.Points), refused: w.Refused})
		}
	}

	return out
}

// mergeBlocked adds the block list's keys to the listing; a key listed by both
// keeps the higher count and the later reset.
func (p *Plugin) mergeBlocked(out []liveKey, blocked []memstore.BlockedKey) []liveKey {
	if len(blocked) == 0 {
		return out
	}

	index := make(map[string]int, len(out))
	for i, e := range out {
		index[p.layers[e.layer].Name+"\x00"+e.key] = i
	}

	for _, b := range blocked {
		li := p.layerIndex(b.Layer)
		if li < 0 || p.layers[li].BlockPrefix != b.Prefix {
			continue
		}

		count := p.layers[li].Points

		if i, ok := index[b.Layer+"\x00"+b.Key]; ok {
			out[i].limited = true

			if out[i].count < count {
				out[i].count = count
			}

			if out[i].reset < b.Reset {
				out[i].reset = b.Reset
			}

			if out[i].refused < b.Refused {
				out[i].refused = b.Refused
			}

			continue
		}

		out = append(out, liveKey{layer: li, key: b.Key, count: count, reset: b.Reset, limited: true, refused: b.Refused})
	}

	return out
}

func (p *Plugin) layerIndex(name string) int {
	for i, l := range p.layers {
		if l.Name == name {
			return i
		}
	}

	return -1
}

// before orders the listing: by count, highest first, then layer name, then key.
func (p *Plugin) before(a, b liveKey) bool {
	if a.count != b.count {
		return a.count > b.count
	}

	if a.layer != b.layer {
		return p.layers[a.layer].Name < p.layers[b.layer].Name
	}

	return a.key < b.key
}

// firstSorted returns the first n entries of the listing in order. A page
// near the top of a long listing is selected in one pass (each entry compared
// once with the page's last, and placed by binary search if it belongs on the
// page) rather than sorting every key: each comparison is an interpreted
// call (doc.go: frames), which made a full sort of a long listing slow.
func (p *Plugin) firstSorted(entries []liveKey, n int) []liveKey {
	if n > len(entries) {
		n = len(entries)
	}

	if n == 0 {
		return nil
	}

	if n > len(entries)/4 {
		sort.Slice(entries, func(i, j int) bool { return p.before(entries[i], entries[j]) })
		return entries[:n]
	}

	top := make([]liveKey, 0, n+1)

	for _, e := range entries {
		e := e
		if len(top) == n && !p.before(e, top[n-1]) {
			continue
		}

		i := sort.Search(len(top), func(j int) bool { return p.before(e, top[j]) })
		top = append(top, liveKey{})
		copy(top[i+1:], top[i:])
		top[i] = e

		if len(top) > n {
			top = top[:n]
		}
	}

	return top
}

// redisFallback reports whether the Redis store is failing and memory decides.
func (p *Plugin) redisFallback() bool {
	rs := p.stores.redis
	return rs != nil && rs.Backend.Down.Load()
}

// redisFallbackReason is why Redis is failing, or "".
func (p *Plugin) redisFallbackReason() string {
	if rs := p.stores.redis; rs != nil {
		return redisstore.FallbackReason(rs.Backend)
	}

	return ""
}

// appendBucket is liveKeys' loop for a token-bucket layer, under the store's
// lock: the live buckets (not full) with their tokens in use as their count,
// limited when the next request would be refused: as for a window, when the
// count is at the points (a take fits while the tokens in use plus its cost
// are at most the burst, limit.BucketTake).
func appendBucket(out []liveKey, i int, l *layer, m map[string]*window, f *liveFilter) []liveKey {
	now, limitedOnly, prefix := f.now, f.limitedOnly, f.prefix
	for key, w := range m {
		if w.Reset <= now || w.List != l.List || (prefix != "" && !strings.HasPrefix(key, prefix)) {
			continue
		}

		_, used := limit.BucketTake(w.Reset, now, 0, l.Points, l.Interval)
		limited := limit.Full(used, l.Points)
		if limited || !limitedOnly {
			out = append(out, liveKey{layer: i, key: key, count: used, reset: w.Reset, limited: limited, refused: w.Refused})
		}
	}

	return out
}
