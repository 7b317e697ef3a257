package harness

// MinimalEdge is the least code that meets the contract of tierlimit's edge
// for an anonymous request: two fixed windows charged in order (global, then
// the client's ip window, or its assets window under a path prefix), the
// five headers of the window with the fewest requests left, and the
// refusal as the README answers it (429, Retry-After, no-store, the JSON
// body). One function, no configuration but the points. It is the floor the
// edge's ratios are judged against (BENCHMARKS.md); it is not this plugin.
var MinimalEdge = LocalPlugin{
	Alias:  "minimaledge",
	Module: "example.com/minimaledge",
	Files: map[string]string{
		".traefik.yml": "displayName: minimaledge\ntype: middleware\nimport: example.com/minimaledge\nsummary: baseline\ntestData: {}\n",
		"go.mod":       "module example.com/minimaledge\n\ngo 1.22\n",
		"minimaledge.go": `package minimaledge

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

type Config struct {
	Points  int64
	Seconds int64
}

func CreateConfig() *Config { return &Config{Points: 100000000, Seconds: 1} }

type window struct {
	count, reset int64
}

type layer struct {
	name   string
	points int64
	limit  []string
	policy []string
	m      map[string]*window
}

type handler struct {
	next     http.Handler
	duration int64
	mu       sync.Mutex
	global   *layer
	ip       *layer
	assets   *layer
	json     []string
	noStore  []string
}

func newLayer(name string, points, seconds int64) *layer {
	limit := strconv.FormatInt(points, 10)
	return &layer{name: name, points: points, limit: []string{limit},
		policy: []string{"\"" + name + "\";q=" + limit + ";w=" + strconv.FormatInt(seconds, 10)}, m: map[string]*window{}}
}

func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	return &handler{next: next, duration: config.Seconds * 1e9,
		global: newLayer("global", 1000000000, config.Seconds), ip: newLayer("ip", config.Points, config.Seconds),
		assets: newLayer("assets", config.Points, config.Seconds),
		json: []string{"application/json"}, noStore: []string{"no-store"}}, nil
}

func (h *handler) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	key := req.Header.Get("X-Forwarded-For")
	if key == "" {
		key = req.RemoteAddr[:strings.LastIndexByte(req.RemoteAddr, ':')]
	}
	tier := h.ip
	if strings.HasPrefix(req.URL.Path, "/assets/") {
		tier = h.assets
	}
	now := time.Now().UnixNano()
	h.mu.Lock()
	g := h.global.m["global"]
	if g == nil || g.reset <= now {
		g = &window{reset: now + h.duration}
		h.global.m["global"] = g
	}
	g.count++
	shown, count, reset := h.global, g.count, g.reset
	if g.count <= h.global.points {
		w := tier.m[key]
		if w == nil || w.reset <= now {
			w = &window{reset: now + h.duration}
			tier.m[key] = w
		}
		w.count++
		if w.count > tier.points || tier.points-w.count < h.global.points-g.count {
			shown, count, reset = tier, w.count, w.reset
		}
	}
	h.mu.Unlock()
	left := "0"
	if count < shown.points {
		left = strconv.FormatInt(shown.points-count, 10)
	}
	secs := strconv.FormatInt((reset-now+999999999)/1e9, 10)
	hd := rw.Header()
	hd["X-Ratelimit-Limit"] = shown.limit
	hd["X-Ratelimit-Remaining"] = []string{left}
	hd["X-Ratelimit-Reset"] = []string{strconv.FormatInt((reset+999999999)/1e9, 10)}
	hd["Ratelimit-Policy"] = shown.policy
	hd["Ratelimit"] = []string{"\"" + shown.name + "\";r=" + left + ";t=" + secs}
	if count > shown.points {
		hd["Retry-After"] = []string{secs}
		hd["Content-Type"] = h.json
		hd["Cache-Control"] = h.noStore
		rw.WriteHeader(http.StatusTooManyRequests)
		rw.Write([]byte("{\"errors\":[{\"message\":\"Hit rate limit\",\"extensions\":{\"code\":\"REQUESTS_EXCEEDED\",\"limit\":" +
			shown.limit[0] + ",\"reset\":\"" + time.Unix((reset+999999999)/1e9, 0).UTC().Format(time.RFC3339) + "\",\"layer\":\"" + shown.name + "\"}}]}"))
		return
	}
	h.next.ServeHTTP(rw, req)
}
`,
	},
}
