package tierlimit

import (
	"net/http"
	"strings"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/request"
)

// How a layer finds its key in a request.
const (
	keyOfClient              = iota // the client IP (ip, assets, routes keyed by ip)
	keyOfPrincipal                  // the principal id (user, service)
	keyOfConst                      // limits.constKey (global, routes keyed by global)
	keyOfPrincipalElseClient        // routes keyed by principal
	keyOfHeader                     // "header:<Name>": the value hashed, else the client IP
	keyOfHost                       // "host": the request's host (hostKey), else the client IP
)

// layer is a layer as the request path uses it, in parts by concern. The
// parts are embedded so that the request path reads l.points, l.entries,
// l.limitHdr alike; each part is built by one function of build.go.
type layer struct {
	limits
	stats *layerStats // decisions since the process started, shared across reloads
	memCounters
	redisEncoding
	headerTable
	refusal
}

// limits is what the configuration says of a layer.
type limits struct {
	name      string
	points    int64
	duration  int64 // nanoseconds
	keyKind   int
	constKey  string
	keyHeader string // canonical, for keyOfHeader
	sliding   bool   // sliding-window counter instead of a fixed window
	interval  int64  // token bucket: nanoseconds per point (tokenbucket.go); 0 for a window
	refill    int64  // token bucket: the points per duration configured; points is then the burst
	// minCost is the smallest cost a request charged to the layer can have:
	// a route's cost (a request is charged the largest cost of its routes),
	// 1 elsewhere (0 reads as 1). The Redis block list blocks only what
	// even that cost would not fit (redisStore.refused).
	minCost int64
	// checkOnly marks a countStatus route's layer as a request's plan holds
	// it: evaluated, never charged (countstatus.go). Its charge, once the
	// response's status is known, goes to route.charge.
	checkOnly bool
	// blockDuration is how long a key this layer refused stays refused,
	// in nanoseconds (0: only while over its limit; block.go).
	blockDuration int64
	// dryRun: the layer counts and reports what it would refuse, but
	// refuses nothing (tally.refuseAs); a fixed window is charged even
	// then, a sliding window or a token bucket takes only what it holds.
	dryRun bool
	// quiet: a dry-run layer of an instance where some rule enforces. The
	// client's headers never show it (tally.allow): they show the most
	// restrictive rule that enforces. When every rule is in dry run (the
	// top-level dryRun), the most restrictive dry-run rule shows.
	quiet bool
	// calendar aligns the layer's fixed windows to days, weeks or months
	// at utcOffset, nanoseconds east of UTC (calendar.go; 0: none).
	calendar  int
	utcOffset int64
	month     *monthPolicy // a month layer's RateLimit-Policy (monthStore)
	// memory: the layer of a Redis instance is counted in memory
	// (mixedStore).
	memory bool
}

// memCounters are the layer's counters in the memory store, resolved once
// (windowStore.attach) so that the request path does no lookup.
type memCounters struct {
	entries map[string]*window
	list    *windowList      // the memory store's list for this duration
	blocks  map[string]int64 // blocked keys' block ends (block.go)
}

// redisEncoding is the layer's part of the Redis script call, RESP-encoded once.
type redisEncoding struct {
	redisArgs     string // points, window (ms) and algorithm
	redisKey      string // the key up to the bucket key
	redisConstKey string // a constant key whole
	maxTTL        int64  // the longest reset the script may report, in ms: the window, twice for sliding
	blockPrefix   string // the start of the layer's block list entries (blockList)
	redisTail     string // a calendar layer's arguments after points and window (calendarCall)
}

// headerTable holds the rate-limit header values that depend only on the
// layer and the requests left. The slices are shared by every response:
// http.Header's Add and Set replace a value rather than write into it.
type headerTable struct {
	limit        string   // points, formatted
	limitHdr     []string // X-RateLimit-Limit
	policyHdr    []string // RateLimit-Policy
	remainingHdr [][]string
	ratePrefix   []string // RateLimit values up to the seconds: `"name";r=12;t=`
	tableLen     int64    // len(remainingHdr)
	// remainingHdr and ratePrefix are indexed by requests left, for the
	// first maxPrecomputed values; larger ones are formatted per request.
}

// refusal is how the layer answers a request it refuses: the answer's
// Policy (status, content type, and either a template (response.body) or the
// default JSON body around its reset time; layer names need no JSON
// escaping: validName), embedded so that the request path reads l.Status,
// l.Body alike, and the fast paths' cache of a default refusal.
type refusal struct {
	answer.Policy
	cache refusalCache // the fast paths', under the memory store's lock (in modeRedis, the block list's)
}

// refusalCache holds a default refusal of the layer, for the reset second
// resetH and secs seconds to the reset: the body and the header values, in
// the order of refusalHeaders (fast.go). Many refusals share them: every
// refusal of a flood within one second, of windows that reset in one second.
type refusalCache struct {
	resetH   string
	resetSec int64 // resetH, parsed
	secs     int64
	body     []byte
	values   [][]string
}

// maxPrecomputed bounds the per-layer header tables.
const maxPrecomputed = 4096

// keyFor returns the layer's bucket key for a request. A principal-keyed route
// counts requests without a principal per client IP, in a namespace of its own
// so that an IP never shares a bucket with a principal id. A header-keyed layer
// falls back to the client IP, never to a shared empty key.
func (l *layer) keyFor(client, principal string, req *http.Request) string {
	switch l.keyKind {
	case keyOfClient:
		return client
	case keyOfPrincipal:
		return principal
	case keyOfConst:
		return l.constKey
	case keyOfHeader:
		// A credential such as an API key: hashed, never kept in clear.
		if req == nil {
			return client
		}

		if v := req.Header[l.keyHeader]; len(v) > 0 && strings.TrimSpace(v[0]) != "" {
			return request.HashKey(strings.TrimSpace(v[0]))
		}

		return client
	case keyOfHost:
		if req == nil {
			return client
		}

		return hostKey(req.Host, client)
	}

	if principal != "" {
		return principal
	}

	return "ip:" + client
}

// route is a route limit with its matcher.
type route struct {
	layer         *layer
	methods       []string
	exact         map[string]bool // canonical (request/path.go)
	prefixes      []string
	lower         bool // ignores case where the instance's paths keep theirs: lowers the path
	caseSensitive bool // compares case where the instance's paths are lowered: canonicalises anew
	// cost is what a matching request is charged in each of its layers
	// (config.Route.Cost).
	cost int64
	// countStatus holds the statuses charged to the route after the
	// response (nil: every request, up front); charge is then the route's
	// layer as that charge takes it: the same counters, not check-only.
	countStatus map[int]bool
	charge      *layer
}

// matches reports whether the request, with its canonical path, is the
// route's. An exact path matches with or without a trailing slash.
func (rt *route) matches(req *http.Request, path string) bool {
	if len(rt.methods) > 0 {
		found := false

		for _, m := range rt.methods {
			if m == req.Method {
				found = true
				break
			}
		}

		if !found {
			return false
		}
	}

	if rt.lower {
		path = strings.ToLower(path)
	} else if rt.caseSensitive {
		path = request.CanonicalPath(req.URL.Path, false)
	}

	n := len(path)

	return rt.exact[path] || n > 1 && path[n-1] == '/' && rt.exact[path[:n-1]] || hasAnyPrefix(path, rt.prefixes)
}

func hasAnyPrefix(path string, prefixes []string) bool {
	for _, prefix := range prefixes {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}

	return false
}
