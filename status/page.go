package status

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
)

// Page is what the status endpoint reads of an instance, fixed in New.
type Page struct {
	Path    string // status.path
	Allowed []netip.Prefix
	Store   string // "memory" or "redis", as configured
	Name    string // the qualified middleware name
	IPs     *request.Resolver
	Events  *events.EventLog
	// Layers is every layer the instance can charge, in evaluation order.
	Layers []*rule.Layer
	Memory *memstore.WindowStore  // the memory store, or the Redis store's fallback
	Redis  *redisstore.RedisStore // nil without Redis
	// Meters, aligned with Layers: what a costFrom route's layer reserves;
	// nil for every other layer.
	Meters []*Meter
	// Held: some layer is a concurrency layer (the in-flight gauge).
	Held bool
	// Registries are the process-wide registries, in the order the metrics
	// list them.
	Registries []Registry
}

// Meter is a costFrom route's (or route plan's) source and reservation.
type Meter struct {
	Source  string
	Reserve int64
}

// Registry is a process-wide registry as the metrics name it.
type Registry struct {
	Name    string
	Entries *lifetime.HeldRegistry
}

// Paging bounds of the key listing.
const (
	defaultKeyLimit = 100
	maxKeyLimit     = 1000
)

const metricsSuffix = "/metrics"

// Serve answers a request whose path starts with pg.Path if it is for the
// status endpoint from an allowed client, and reports whether it did; now is
// the instance's clock.
func Serve(pg *Page, rw http.ResponseWriter, req *http.Request, now func() time.Time) bool {
	path := req.URL.Path
	rest := path[len(pg.Path):]
	if rest != "" && rest != metricsSuffix && rest != resetSuffix {
		return false
	}

	// The client resolved as the limiter resolves it (trusted proxies,
	// trustedHops).
	if !request.ClientIn(pg.IPs, req, pg.Allowed) {
		return false
	}

	h := rw.Header()
	h["Cache-Control"] = answer.NoStore

	if rest == resetSuffix {
		serveReset(pg, rw, req, now)
		return true
	}

	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		h["Allow"] = []string{"GET, HEAD"}
		writeStatus(rw, req, http.StatusMethodNotAllowed, answer.JSONContentType, []byte(`{"error":"method not allowed"}`))

		return true
	}

	at := now().UnixNano()

	if rest == metricsSuffix {
		writeStatus(rw, req, http.StatusOK, metricsContentType, []byte(Metrics(pg, at)))
		return true
	}

	body, code := JSON(pg, req, at)
	writeStatus(rw, req, code, answer.JSONContentType, body)

	return true
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
	// CostFrom is a costFrom route's settlement (../meter.go); nil elsewhere.
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

// JSON returns the status document at now, or a 400 for a bad query
// parameter.
func JSON(pg *Page, req *http.Request, now int64) ([]byte, int) {
	q, bad := parseKeyQuery(req)
	if bad != "" {
		body, _ := json.Marshal(statusError{Error: "invalid query parameter " + bad, Parameter: bad})
		return body, http.StatusBadRequest
	}

	entries, tracked := liveKeys(pg, now, q.limited, q.prefix)
	total := len(entries)
	entries = firstSorted(pg.Layers, entries, pageEnd(q, total))

	report := statusReport{
		Middleware:          pg.Name,
		Store:               pg.Store,
		RedisFallback:       redisFallback(pg),
		RedisFallbackReason: redisFallbackReason(pg),
		Evictions:           pg.Memory.Evicted(),
		Counting:            countingRule,
		Layers:              statusLayers(pg, tracked),
		Keys:                statusKeys{Total: total, Offset: q.offset, Limit: q.limit, Items: statusItems(pg.Layers, entries, q.offset)},
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
// started and the keys its map holds (tracked, aligned with pg.Layers).
func statusLayers(pg *Page, tracked []int) []statusLayer {
	out := make([]statusLayer, 0, len(pg.Layers))

	for i, l := range pg.Layers {
		allowed, refused := pg.Memory.Totals(l.Stats)

		sl := statusLayer{
			Name: l.Name, Points: l.Capacity, Duration: time.Duration(l.Duration).String(), Algorithm: config.AlgorithmName(l.Algorithm),
			TrackedKeys: tracked[i], Allowed: allowed, Refused: refused,
		}

		if l.Algorithm == limit.TokenBucket {
			sl.Points = l.Refill
			sl.Burst = l.Capacity
		}

		if m := pg.Meters[i]; m != nil {
			sl.CostFrom = &statusMeter{Source: m.Source, Reserve: m.Reserve, Reserved: atomic.LoadInt64(&l.Stats.Reserved),
				Settled: atomic.LoadInt64(&l.Stats.Settled), Unreported: atomic.LoadInt64(&l.Stats.Unreported)}
		}

		out = append(out, sl)
	}

	return out
}

// statusItems describes the sorted listing's keys from offset on.
func statusItems(layers []*rule.Layer, entries []liveKey, offset int) []statusKey {
	items := []statusKey{}

	for i := offset; i < len(entries); i++ {
		e := entries[i]
		l := layers[e.layer]
		resetUnix := limit.CeilSeconds(e.reset)

		items = append(items, statusKey{
			Layer: l.Name, Key: e.key, Count: e.count, Limit: l.Capacity, Limited: e.limited, Refused: e.refused,
			Reset: time.Unix(resetUnix, 0).UTC().Format(time.RFC3339), ResetUnix: resetUnix,
		})
	}

	return items
}

// redisFallback reports whether the Redis store is failing and memory decides.
func redisFallback(pg *Page) bool {
	rs := pg.Redis
	return rs != nil && rs.Backend.Down.Load()
}

// redisFallbackReason is why Redis is failing, or "".
func redisFallbackReason(pg *Page) string {
	if rs := pg.Redis; rs != nil {
		return redisstore.FallbackReason(rs.Backend)
	}

	return ""
}
