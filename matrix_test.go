package tierlimit

import (
	"compress/gzip"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

// The fault matrix: every charging feature, alone and beside
// another, on every store, through every request path that can serve it,
// first with no fault (every store and path must answer the script alike
// and end with the same counts), then under each fault around one request
// of the script, with the same invariants after each: reservations and
// requests in flight back to 0, no goroutine of the plugin left behind,
// counts equal to what the responses reported (or the reservation where
// nothing was), never over the points, Traefik still serving.
//
// A row is a configuration and a script; a fault is what happens around
// one request of it. The next feature is one more row, and meets every
// fault on its first day.

// mxReq is one request of a row's script: what the backend answers.
type mxReq struct {
	hdr    map[string]string // request headers (a principal, a plan)
	status int               // the backend's status (0: 200)
	cost   int64             // the cost its answer states (header X-Cost and the stream's usage); -1: none
}

// mxSaw is what the plugin saw of a request's answer, from the proxy behind
// it: whether the request got there (the plugin admitted it), the status the
// proxy wrote, and the last cost its header and its stream stated (-1: none).
type mxSaw struct {
	reached bool
	status  int
	header  int64
	body    int64
}

// mxRow is a feature: a configuration (routes on /v1/) and a script.
type mxRow struct {
	name   string
	conf   func(c *Config)
	script []mxReq
	// charge is what a request charges the route layers in all, given
	// what the plugin saw of its answer.
	charge func(q mxReq, s mxSaw) int64
	// over is what a route layer may hold past its points: costs reported
	// beyond the reservation, or everything in dry run.
	over int64
	// uncounted: the route layers' state is not a count (token buckets,
	// concurrency), compared by answers only.
	uncounted bool
	// end is the end of the window the row's requests fall in when the
	// clock is at it minus a few seconds (the clock faults).
	end time.Time
}

const mxClient = "203.0.113.9:1"

// mxBase is every row's instance: the ip layer beside the routes, the
// status page, the principal and plan headers read.
func mxBase(c *Config) {
	c.Global.Points = 0
	c.IP = config.LayerConfig{Points: 100, Duration: "60s"}
	c.Assets.Points, c.Assets.Duration = 100, "60s" // an empty assets plan would send everything to the general path
	c.User.Points, c.Service.Points = 0, 0
	c.Status.Path = "/_tl"
}

func mxRoutes(routes ...config.RouteConfig) func(c *Config) {
	return func(c *Config) {
		mxBase(c)
		for i := range routes {
			routes[i].Paths = []string{"/v1/"}
		}
		c.Routes = routes
	}
}

// Charges: what an admitted request charges the route layers in all.
func mxChargeEach(n int64) func(q mxReq, s mxSaw) int64 {
	return func(q mxReq, s mxSaw) int64 {
		if !s.reached {
			return 0
		}
		return n
	}
}

func mxChargeStatus(listed int) func(q mxReq, s mxSaw) int64 {
	return func(q mxReq, s mxSaw) int64 {
		if s.reached && s.status == listed {
			return 1
		}
		return 0
	}
}

// chargeStated is a costFrom route's charge: the last cost its answer
// stated (from header or body), else the reservation.
func mxChargeStated(fromHeader bool, reserve int64) func(q mxReq, s mxSaw) int64 {
	return func(q mxReq, s mxSaw) int64 {
		if !s.reached {
			return 0
		}
		stated := s.body
		if fromHeader {
			stated = s.header
		}
		if stated < 0 {
			return reserve
		}
		return stated
	}
}

func plainScript(n int) []mxReq {
	s := make([]mxReq, n)
	for i := range s {
		s[i] = mxReq{cost: -1}
	}
	return s
}

func costScript(costs ...int64) []mxReq {
	s := make([]mxReq, len(costs))
	for i, c := range costs {
		s[i] = mxReq{cost: c}
	}
	return s
}

// gzipScript is costScript with answers gzip-compressed, their usage
// stated as an LLM's (mxBackend).
func gzipScript(costs ...int64) []mxReq {
	s := costScript(costs...)
	for i := range s {
		s[i].hdr = map[string]string{"X-Mx-Gzip": "1", "Accept-Encoding": "gzip, br"}
	}
	return s
}

// bodyScript is a script for a route keyed by API key and model: each
// request names its model after 20 KB of messages. (One key: the clock
// faults bound what a layer admits as one key's points.)
func bodyScript() []mxReq {
	var s []mxReq
	for i := 0; i < 5; i++ {
		s = append(s, mxReq{hdr: map[string]string{"X-Api-Key": "k1", bodyHeader: string(chatBody("gpt-4o", 20<<10))}, cost: -1})
	}
	return s
}

var mxMinute = utc(2026, 6, 15, 10, 1, 0)

func matrixRows() []mxRow {
	day, week, month := utc(2026, 6, 16, 0, 0, 0), utc(2026, 6, 22, 0, 0, 0), utc(2026, 7, 1, 0, 0, 0)
	window := func(algorithm string) config.RouteConfig {
		return config.RouteConfig{Name: "rt", Points: 3, Duration: "60s", Algorithm: algorithm}
	}
	calendar := func(period string) config.RouteConfig {
		return config.RouteConfig{Name: "rt", Points: 3, Calendar: period}
	}
	status := []mxReq{{status: 401, cost: -1}, {cost: -1}, {status: 401, cost: -1}, {status: 401, cost: -1}, {status: 401, cost: -1}}
	plans := func() []mxReq {
		var s []mxReq
		for i := 0; i < 4; i++ {
			s = append(s, mxReq{hdr: map[string]string{"X-Auth-User": "alice"}, cost: -1},
				mxReq{hdr: map[string]string{"X-Auth-User": "carol", "X-Auth-Plan": "pro"}, cost: -1})
		}
		return s
	}()

	return []mxRow{
		{name: "fixed", conf: mxRoutes(window("")), script: plainScript(5), charge: mxChargeEach(1), end: mxMinute},
		{name: "sliding", conf: mxRoutes(window("sliding")), script: plainScript(5), charge: mxChargeEach(1), end: mxMinute},
		{name: "tokenbucket", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 1, Duration: "1h", Algorithm: "tokenbucket", Burst: 3}),
			script: plainScript(5), charge: mxChargeEach(1), uncounted: true, end: mxMinute},
		{name: "calendar day", conf: mxRoutes(calendar("day")), script: plainScript(5), charge: mxChargeEach(1), end: day},
		{name: "calendar week", conf: mxRoutes(calendar("week")), script: plainScript(5), charge: mxChargeEach(1), end: week},
		{name: "calendar month", conf: mxRoutes(calendar("month")), script: plainScript(5), charge: mxChargeEach(1), end: month},
		{name: "concurrency", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 1, Duration: "60s", Algorithm: "concurrency"}),
			script: plainScript(4), charge: mxChargeEach(0), uncounted: true, end: mxMinute},
		{name: "cost", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 7, Duration: "60s", Cost: 2}), script: plainScript(5), charge: mxChargeEach(2), end: mxMinute},
		{name: "costFrom header, reserve", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 10, Duration: "60s", CostFrom: "header:X-Cost", Reserve: 3}),
			script: costScript(2, 1, 3, 3, 2, 3, 3), charge: mxChargeStated(true, 3), end: mxMinute},
		{name: "costFrom stream, no reserve", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 6, Duration: "60s", CostFrom: "json:usage.total_tokens"}),
			script: costScript(2, 2, 1, 2, 1, 1), charge: mxChargeStated(false, 1), over: 1, end: mxMinute},
		{name: "costFrom gzip stream, llm: sum", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 6, Duration: "60s", CostFrom: "llm:input + 2*llm:output"}),
			script: gzipScript(2, 2, 1, 2, 1, 1), charge: mxChargeStated(false, 1), over: 1, end: mxMinute},
		{name: "countStatus", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 2, Duration: "60s", CountStatus: []int{401}}),
			script: status, charge: mxChargeStatus(401), end: mxMinute},
		{name: "route plans", conf: with(mxRoutes(config.RouteConfig{Name: "rt", Key: "principal", Points: 3, Duration: "60s",
			Plans: map[string]config.PlanConfig{"pro": {Points: 2, Duration: "60s"}}}), func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-Auth-User", "X-Auth-Plan"
			c.User = config.LayerConfig{Points: 100, Duration: "60s"}
			c.Plans = map[string]config.PlanConfig{"pro": {Points: 100, Duration: "60s"}}
		}), script: plans, charge: mxChargeEach(1), end: mxMinute},
		{name: "block", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 2, Duration: "60s", BlockDuration: "120s"}), script: plainScript(4), charge: mxChargeEach(1), end: mxMinute},
		{name: "dry run", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 2, Duration: "60s", DryRun: true}), script: plainScript(4), charge: mxChargeEach(1), over: 1000, end: mxMinute},
		{name: "concurrency beside costFrom", conf: mxRoutes(
			config.RouteConfig{Name: "conc", Points: 1, Duration: "60s", Algorithm: "concurrency"},
			config.RouteConfig{Name: "tok", Points: 10, Duration: "60s", CostFrom: "header:X-Cost", Reserve: 3}),
			script: costScript(2, 1, 3, 3, 2, 3, 3), charge: mxChargeStated(true, 3), end: mxMinute},
		{name: "a route keyed by the request body", conf: mxRoutes(config.RouteConfig{Name: "rt", Key: "header:X-Api-Key,json:model", Points: 2, Duration: "60s"}),
			script: bodyScript(), charge: mxChargeEach(1), end: mxMinute},
		// One token an hour: the second request waits an hour for its
		// place (the faulted one), the third two, the rest are refused; the
		// two places reserved ahead are admitted at once here (the matrix's
		// waits end at once), over the burst.
		{name: "maxDelay", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 1, Duration: "1h", Algorithm: "tokenbucket", Burst: 1, MaxDelay: "150m"}),
			script: plainScript(5), charge: mxChargeEach(1), over: 2, uncounted: true, end: mxMinute},
		// A day of 3 whose maxDelay always reaches the next day: the fourth
		// and later wait for the next day's 3 places (in Redis its key),
		// admitted at once here, over the day's points.
		{name: "maxDelay on a calendar day", conf: mxRoutes(config.RouteConfig{Name: "rt", Points: 3, Calendar: "day", MaxDelay: "25h"}),
			script: plainScript(5), charge: mxChargeEach(1), over: 3, uncounted: true, end: day},
		// The token bucket of "maxDelay" as the ip layer, beside a costFrom
		// route whose answers are gzip-compressed: the second and third
		// wait for ip's places, and their reservations are settled from
		// their compressed usage as any other's; the rest are refused by
		// ip and charge the route nothing.
		{name: "maxDelay beside costFrom gzip", conf: with(mxRoutes(config.RouteConfig{Name: "tok", Points: 6, Duration: "60s", CostFrom: "llm:input + 2*llm:output"}),
			func(c *Config) {
				c.IP = config.LayerConfig{Points: 1, Duration: "1h", Algorithm: "tokenbucket", Burst: 1, MaxDelay: "150m"}
			}), script: gzipScript(2, 2, 1, 2, 1), charge: mxChargeStated(false, 1), over: 1, end: mxMinute},
		{name: "per minute beside per day", conf: mxRoutes(
			config.RouteConfig{Name: "tpm", Points: 3, Duration: "60s"},
			config.RouteConfig{Name: "tpd", Points: 4, Calendar: "day"}),
			script: plainScript(5), charge: mxChargeEach(2), end: mxMinute},
	}
}

// mxStore is a store an instance counts in.
type mxStore struct {
	name  string
	conf  func(c *Config)
	admin *redisresp.Pool // nil: memory
	// edge, when set, is an instance before the cell's in the chain (the
	// recommended chain's edge): the front serves it, it serves the cell's.
	edge func(c *Config)
}

// mxExactAdmin is the exact Redis server's client (a reload to another
// store goes there).
var mxExactAdmin *redisresp.Pool

// admin is the client of the server the cell's instances on Redis use.
func (c *mxCell) admin() *redisresp.Pool {
	if c.store.admin != nil {
		return c.store.admin
	}

	return mxExactAdmin
}

// mxBackend answers each request as its X-Mx-* headers say: a status, a
// cost in header X-Cost and in the event stream's usage, and a mode: held
// before its headers or in its body until released (or its client gone),
// a panic, a 5xx.
type mxBackend struct {
	mu    sync.Mutex
	holds map[string]*mxHold
}

type mxHold struct {
	arrived, release chan struct{}
	once             sync.Once
}

func (b *mxBackend) hold(id string) *mxHold {
	b.mu.Lock()
	defer b.mu.Unlock()

	hd := &mxHold{arrived: make(chan struct{}), release: make(chan struct{})}
	b.holds[id] = hd

	return hd
}

func (b *mxBackend) held(id string) *mxHold {
	b.mu.Lock()
	defer b.mu.Unlock()

	return b.holds[id]
}

func (hd *mxHold) free() { hd.once.Do(func() { close(hd.release) }) }

// wait waits for the request to reach the backend; false when its handler
// ended first (the plugin refused it).
func (hd *mxHold) wait(t *testing.T, ended chan struct{}) bool {
	t.Helper()

	select {
	case <-hd.arrived:
		return true
	case <-ended:
		return false
	case <-time.After(20 * time.Second):
		t.Fatal("the request neither reached the backend nor ended")
		return false
	}
}

func (b *mxBackend) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	mode, hd := req.Header.Get("X-Mx-Mode"), b.held(req.Header.Get("X-Mx-Id"))
	cost, _ := strconv.ParseInt(req.Header.Get("X-Mx-Cost"), 10, 64)
	status, _ := strconv.Atoi(req.Header.Get("X-Mx-Status"))

	arrive := func() bool {
		close(hd.arrived)
		select {
		case <-hd.release:
			return true
		case <-req.Context().Done():
			return false
		}
	}

	switch mode {
	case "panic":
		panic(http.ErrAbortHandler) // net/http logs nothing for this one
	case "5xx":
		rw.WriteHeader(http.StatusInternalServerError)
		_, _ = rw.Write([]byte("error"))
		return
	case "hold":
		if !arrive() {
			return
		}
	}

	rw.Header().Set("Content-Type", "text/event-stream")
	usage := "null"
	if cost >= 0 {
		rw.Header().Set("X-Cost", strconv.FormatInt(cost, 10))
		usage = `{"total_tokens":` + strconv.FormatInt(cost, 10) + `}`
	}
	if status == 0 {
		status = http.StatusOK
	}

	// A gzip answer (its request accepting only what the plugin reads)
	// states its usage as an LLM's: input + 2*output = cost.
	var out io.Writer = rw
	if req.Header.Get("X-Mx-Gzip") == "1" && req.Header.Get("Accept-Encoding") == "gzip" {
		rw.Header().Set("Content-Encoding", "gzip")
		z := gzip.NewWriter(rw)
		defer z.Close()
		out = mxFlushing{z}
		if cost >= 0 {
			usage = `{"total_tokens":` + strconv.FormatInt(cost, 10) + `,"prompt_tokens":` + strconv.FormatInt(cost%2, 10) +
				`,"completion_tokens":` + strconv.FormatInt(cost/2, 10) + `}`
		}
	}

	rw.WriteHeader(status)
	_, _ = out.Write([]byte(`data: {"usage":` + usage + "}\n\n"))
	http.NewResponseController(rw).Flush() //nolint:errcheck

	if mode == "stream" && !arrive() {
		return
	}

	_, _ = out.Write([]byte("data: [DONE]\n\n"))
}

// mxFlushing flushes its compressor after each write: the event leaves
// whole (net/http sends both when the handler flushes).
type mxFlushing struct{ z *gzip.Writer }

func (f mxFlushing) Write(b []byte) (int, error) {
	n, err := f.z.Write(b)
	_ = f.z.Flush()
	return n, err
}

// mxSeeing records, between the plugin and the proxy, what the plugin saw
// of each answer (by X-Mx-Id).
type mxSeeing struct {
	next http.Handler
	*mxSeen
}

// mxSeen is what a cell's instances saw, by request id.
type mxSeen struct {
	mu  sync.Mutex
	saw map[string]*mxSaw
}

func (s *mxSeen) get(id string) mxSaw {
	s.mu.Lock()
	defer s.mu.Unlock()

	if v := s.saw[id]; v != nil {
		return *v
	}

	return mxSaw{header: -1, body: -1}
}

func (s *mxSeeing) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	v := &mxSaw{reached: true, header: -1, body: -1}
	s.mu.Lock()
	s.saw[req.Header.Get("X-Mx-Id")] = v
	s.mu.Unlock()

	s.next.ServeHTTP(&mxWriter{rw: rw, s: s.mxSeen, v: v}, req)
}

type mxWriter struct {
	rw     http.ResponseWriter
	s      *mxSeen
	v      *mxSaw
	buf    string
	headed bool
	// A gzip answer: its bytes so far, and how much of them decoded.
	raw     []byte
	decoded int
}

func (w *mxWriter) Header() http.Header { return w.rw.Header() }

func (w *mxWriter) WriteHeader(code int) {
	if !w.headed {
		w.headed = true
		w.s.mu.Lock()
		w.v.status = code
		if n, err := strconv.ParseInt(w.rw.Header().Get("X-Cost"), 10, 64); err == nil {
			w.v.header = n
		}
		w.s.mu.Unlock()
	}
	w.rw.WriteHeader(code)
}

func (w *mxWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.rw.Header().Get("Content-Encoding") == "gzip" {
		w.raw = append(w.raw, b...)
		text := decodedPrefix(w.raw)
		w.buf += text[w.decoded:]
		w.decoded = len(text)
	} else {
		w.buf += string(b)
	}

	for {
		i := strings.Index(w.buf, "\n\n")
		if i < 0 {
			break
		}
		event := w.buf[:i]
		w.buf = w.buf[i+2:]

		if j := strings.Index(event, `"total_tokens":`); j >= 0 {
			rest := event[j+len(`"total_tokens":`):]
			k := strings.IndexAny(rest, "},")
			if n, err := strconv.ParseInt(rest[:k], 10, 64); err == nil {
				w.s.mu.Lock()
				w.v.body = n
				w.s.mu.Unlock()
			}
		}
	}

	return w.rw.Write(b)
}

func (w *mxWriter) Flush() { _ = http.NewResponseController(w.rw).Flush() }

func (w *mxWriter) Unwrap() http.ResponseWriter { return w.rw }

// mxCell runs one row's script on one store and path, under one fault.
type mxCell struct {
	t      *testing.T
	row    mxRow
	store  mxStore
	conf   func(c *Config) // the row's on the store
	path   string          // "chosen" or "general"
	be     *mxBackend
	seeing *mxSeen
	h      *harness   // the instance the front serves now
	insts  []*harness // every instance: reloads' and replicas'
	redis  []bool     // whether insts[i] counts in Redis
	seq    int
	sent   []mxSent
	proxy  *switchProxy // between the instances and Redis (the Redis fault)
}

// mxSent is a request sent: on which instance, what the plugin saw, and
// what the client got (0: nothing).
type mxSent struct {
	q    mxReq
	inst int
	id   string
	code int
	left string // X-RateLimit-Remaining
}

// instance builds an instance of conf in the world (proxied), on the
// cell's path, backend and clock t0.
func (c *mxCell) instance(conf func(c *Config)) *harness {
	h := newProxiedHarness(c.t, conf)
	c.adopt(h)

	return h
}

// adopt puts an instance (new, or a reload's) on the cell's backend and
// path, its synced store on its manual clock.
func (c *mxCell) adopt(h *harness) {
	h.backend = c.be
	if _, ok := h.p.next.(*mxSeeing); !ok {
		h.p.next = &mxSeeing{next: h.p.next, mxSeen: c.seeing}
	}

	if c.path == "general" {
		h.p.mode = modeGeneral
		h.h = h.p
		h.front.mu.Lock()
		h.front.serving = h.p
		h.front.mu.Unlock()
	}

	if rs := h.p.stores.redis; rs != nil && rs.Synced != nil {
		syncedOf(c.t, h)
	}

	if c.store.edge != nil && len(c.insts) == 0 {
		edge := newHarness(c.t, c.store.edge)
		edge.clock = h.clock
		edge.p.now = h.clock.Now
		edge.p.next = h.h
		h.front.mu.Lock()
		h.front.serving = edge.h
		h.front.mu.Unlock()
	}

	c.insts = append(c.insts, h)
	c.redis = append(c.redis, h.p.stores.redis != nil)
}

func (c *mxCell) index(h *harness) int {
	for i, x := range c.insts {
		if x == h {
			return i
		}
	}
	c.t.Fatal("not an instance of the cell")
	return -1
}

// headers are request i's, telling the backend how to answer in mode.
func (c *mxCell) headers(q mxReq, mode string) (map[string]string, string) {
	c.seq++
	id := strconv.Itoa(c.seq)
	hdr := map[string]string{"X-Mx-Id": id, "X-Mx-Mode": mode, "X-Mx-Cost": strconv.FormatInt(q.cost, 10), "X-Mx-Status": strconv.Itoa(q.status)}
	for k, v := range q.hdr {
		hdr[k] = v
	}

	return hdr, id
}

// send sends q to h and waits for its handler's end.
func (c *mxCell) send(h *harness, q mxReq, mode string) {
	hdr, id := c.headers(q, mode)
	rec := h.do(http.MethodPost, "/v1/chat", mxClient, hdr)
	c.sent = append(c.sent, mxSent{q: q, inst: c.index(h), id: id, code: rec.Code, left: rec.Header().Get("X-RateLimit-Remaining")})
}

// open sends q to h held in mode ("hold" before its headers, "stream" in
// its body), and returns its request and hold.
func (c *mxCell) open(h *harness, q mxReq, mode string) (*openRequest, *mxHold) {
	hdr, id := c.headers(q, mode)
	hd := c.be.hold(id)
	o := h.open(http.MethodPost, "/v1/chat", mxClient, hdr)
	c.sent = append(c.sent, mxSent{q: q, inst: c.index(h), id: id})

	return o, hd
}

// until sends q held before its headers, and ends it as cancel says
// (doUntil) once it reached the backend.
func (c *mxCell) until(h *harness, q mxReq, cancel string) {
	hdr, id := c.headers(q, "hold")
	hd := c.be.hold(id)
	stop, done := make(chan struct{}), make(chan struct{})

	go func() {
		select {
		case <-hd.arrived:
		case <-done:
		}
		close(stop)
	}()

	code := h.doUntil(http.MethodPost, "/v1/chat", mxClient, hdr, cancel, stop)
	close(done)
	hd.free()
	c.sent = append(c.sent, mxSent{q: q, inst: c.index(h), id: id, code: code})
}

// mxFault is what happens around request at of a script (or, for the
// clock faults, to the whole script).
type mxFault struct {
	name string
	// redisOnly: the fault needs Redis; noCluster: it cuts the network to
	// Redis, which a Cluster client would go around (its nodes' addresses).
	redisOnly, noCluster bool
	// noCounts: the counts are not compared with the charges, only with
	// the points (after Redis lost its data; after a clock fault, whose
	// replica ahead counts in its next window, the admitted charges are).
	noCounts bool
	run      func(c *mxCell, q mxReq)
	// script, when set, runs the whole script in place of run.
	script func(c *mxCell)
	// prepare, when set, changes the cell's configuration before its first
	// instance is built.
	prepare func(c *mxCell)
	// settle, when set, runs after the script, before the invariants are
	// checked.
	settle func(c *mxCell)
}

func mxReload(change func(c *mxCell) func(cfg *Config)) func(c *mxCell, q mxReq) {
	return func(c *mxCell, q mxReq) {
		o, hd := c.open(c.h, q, "hold")
		reached := hd.wait(c.t, o.ended)
		r := reloaded(c.t, c.h, change(c))
		c.adopt(r)
		c.h = r
		hd.free()
		if reached {
			o.readAll()
		}
		o.wait()
	}
}

func matrixFaults() []mxFault {
	hangUp := func(mode string) func(c *mxCell, q mxReq) {
		return func(c *mxCell, q mxReq) {
			o, hd := c.open(c.h, q, mode)
			if hd.wait(c.t, o.ended) && mode == "stream" {
				// The first event, with its stated cost; compressed, the end of
				// the compressor's flush after it.
				until := "\n\n"
				if q.hdr["X-Mx-Gzip"] == "1" {
					until = "\x00\x00\xff\xff"
				}
				o.readUntil(until)
			}
			o.hangUp()
			o.wait()
			hd.free()
		}
	}

	return []mxFault{
		{name: "no fault", run: func(c *mxCell, q mxReq) { c.send(c.h, q, "") }},
		{name: "client hangs up before the headers", run: hangUp("hold")},
		{name: "client hangs up during the body", run: hangUp("stream")},
		{name: "client hangs up after the last byte", run: func(c *mxCell, q mxReq) {
			o, _ := c.open(c.h, q, "")
			o.head()
			o.readAll()
			o.hangUp()
			o.wait()
		}},
		{name: "backend panics", run: func(c *mxCell, q mxReq) { c.send(c.h, q, "panic") }},
		{name: "backend answers 5xx", run: func(c *mxCell, q mxReq) { c.send(c.h, q, "5xx") }},
		{name: "backend silent until the client's timeout", run: func(c *mxCell, q mxReq) { c.until(c.h, q, "client") }},
		{name: "request's context cancelled", run: func(c *mxCell, q mxReq) { c.until(c.h, q, "context") }},
		{name: "reload to the same settings", run: mxReload(func(c *mxCell) func(*Config) { return c.conf })},
		{name: "reload changing Redis settings", run: mxReload(func(c *mxCell) func(*Config) {
			return with(c.conf, func(cfg *Config) { cfg.Redis.Timeout = "2s"; cfg.Redis.PoolSize = 7 })
		})},
		{name: "reload to another store", run: mxReload(func(c *mxCell) func(*Config) {
			if c.store.admin != nil {
				return with(c.conf, func(cfg *Config) { cfg.Store = "memory" })
			}
			return with(c.conf, func(cfg *Config) {
				cfg.Store = "redis"
				cfg.Redis.Address = mxExactAddr
				asACLUser(cfg)
			})
		})},
		{name: "Redis killed mid-request, restarted empty", redisOnly: true, noCluster: true, noCounts: true,
			prepare: func(c *mxCell) {
				c.proxy = newSwitchProxy(c.t, mxExactAddr)
				c.conf = with(c.conf, func(cfg *Config) { cfg.Redis.Address = c.proxy.l.Addr().String() })
			},
			run: func(c *mxCell, q mxReq) {
				o, hd := c.open(c.h, q, "hold")
				reached := hd.wait(c.t, o.ended)
				for _, h := range c.insts {
					h.p.stores.redis.Backend.Log = io.Discard // the outage's events
				}
				c.proxy.cut()
				hd.free()
				if reached {
					o.readAll()
				}
				o.wait()
				redisDo(c.t, c.admin(), "FLUSHALL")
				redisDo(c.t, c.admin(), "SCRIPT", "FLUSH")
				c.proxy.restore()
			},
			settle: func(c *mxCell) {
				for _, h := range c.insts {
					waitFor(c.t, "the recovery from Redis's restart", func() bool { return fallbackMetric(c.t, h) == "0" })
				}
			}},
		{name: "replicas with clocks 5s apart", redisOnly: true, noCounts: true, script: func(c *mxCell) { mxSkew(c, 5*time.Second) }},
		{name: "replicas with clocks 30s apart", redisOnly: true, noCounts: true, script: func(c *mxCell) { mxSkew(c, 30*time.Second) }},
	}
}

// mxExactAddr is the exact Redis server's address (a reload to another
// store goes there).
var mxExactAddr string

// mxSkew runs the script on two replicas on one Redis whose clocks are
// skew apart, late in the row's window: the one behind sends the first
// two requests, the one ahead the rest; then skew+2s pass (the one ahead is in
// its next window, the one behind 3s before the end of its own) and the
// one behind sends the script again. Over both, the window the replica
// behind is in admits no more than its points.
func mxSkew(c *mxCell, skew time.Duration) {
	behind := c.h
	ahead := c.instance(c.conf)
	replicaOf(behind, ahead)
	if rs := ahead.p.stores.redis; rs != nil && rs.Synced != nil {
		syncedOf(c.t, ahead)
	}
	setClock(behind, c.row.end.Add(-skew-5*time.Second))
	setClock(ahead, c.row.end.Add(-5*time.Second))

	// Two first: the replica behind counts in every key (both of the plans
	// row), which docs/redis.md#clocks asks of clocks further apart than
	// KeyGrace.
	c.send(behind, c.row.script[0], "")
	c.send(behind, c.row.script[1], "")
	for _, q := range c.row.script[2:] {
		c.send(ahead, q, "")
	}

	passTime(c.t, c.store.admin, skew+2*time.Second, ahead, behind)

	for _, q := range c.row.script {
		c.send(behind, q, "")
	}
}

// TestMatrix runs every row on every store and path under every fault.
func TestMatrix(t *testing.T) {
	exact, exactAdmin := redisServer(t)
	mxExactAddr, mxExactAdmin = exact, exactAdmin
	cluster, clusterAdmin := clusterNode(t)

	stores := []mxStore{
		{name: "memory", conf: func(*Config) {}},
		{name: "exact Redis", admin: exactAdmin, conf: func(c *Config) {
			c.Store, c.Redis.Address, c.Redis.Timeout = "redis", exact, "1s"
			asACLUser(c)
		}},
		{name: "synced Redis", admin: exactAdmin, conf: func(c *Config) {
			c.Store, c.Redis.Address, c.Redis.Timeout, c.Redis.SyncInterval = "redis", exact, "1s", "1h"
			asACLUser(c)
		}},
		{name: "synced Redis behind an edge on exact Redis", admin: exactAdmin, conf: func(c *Config) {
			c.Store, c.Redis.Address, c.Redis.Timeout, c.Redis.SyncInterval = "redis", exact, "1s", "1h"
			asACLUser(c)
		}, edge: func(c *Config) {
			c.Store, c.Redis.Address, c.Redis.Timeout = "redis", exact, "1s"
			asACLUser(c)
			c.Global.Points = 0
			c.IP = config.LayerConfig{Points: 100, Duration: "60s"}
			c.Exempt.IPs = []string{"127.0.0.1/32"} // the status page's reader
		}},
		{name: "Cluster", admin: clusterAdmin, conf: func(c *Config) {
			c.Store, c.Redis.Timeout = "redis", "1s"
			c.Redis.Cluster = &config.RedisClusterConfig{Addresses: []string{cluster}}
		}},
	}

	// A request that waits for its place (maxDelay) goes on at once: the
	// matrix's faults meet it once it has its place (its wait and a
	// client gone while waiting: delay_test.go).
	old := afterDelay
	afterDelay = func(_ time.Duration, f func()) func() bool { return time.AfterFunc(0, f).Stop }
	defer func() { afterDelay = old }()

	for _, fault := range matrixFaults() {
		t.Run(fault.name, func(t *testing.T) { matrixFault(t, fault, stores) })
	}
}

// matrixFault runs every row on every store and path under fault.
func matrixFault(t *testing.T, fault mxFault, stores []mxStore) {
	{
		for _, row := range matrixRows() {
			var first *mxResult

			for _, store := range stores {
				if fault.redisOnly && store.admin == nil || fault.noCluster && store.name == "Cluster" {
					continue // memory has no Redis to fault; a Cluster client goes to the nodes' own addresses
				}

				conf := with(row.conf, store.conf)
				cfg := CreateConfig()
				conf(cfg)

				if _, err := parse(cfg); err != nil {
					continue // the store does not take the row (synced: no sliding window, no bucket)
				}

				for _, path := range []string{"chosen", "general"} {
					if path == "general" && chooseModeOf(cfg) == modeGeneral {
						continue // the row's one path is the general one
					}

					name := fault.name + " / " + row.name + " / " + store.name + " / " + path
					res := runCell(t, name, row, store, conf, path, fault)
					t.Logf("cell %s: %s", name, map[bool]string{true: "ok", false: "FAILED"}[res != nil])

					if fault.name == "no fault" && res != nil {
						if first == nil {
							first = res
						} else if msg := first.differs(res); msg != "" {
							t.Errorf("%s answers otherwise than %s: %s", name, first.name, msg)
						}
					}
				}
			}
		}
	}
}

func chooseModeOf(cfg *Config) mode {
	s, _ := parse(cfg)
	return chooseMode(s)
}

// mxResult is what a cell without a fault ends with: its answers and counts.
type mxResult struct {
	name    string
	answers []string
	counts  map[string]int64 // by layer; nil when not counted
}

func (a *mxResult) differs(b *mxResult) string {
	if strings.Join(a.answers, " ") != strings.Join(b.answers, " ") {
		return "answers " + strings.Join(b.answers, " ") + ", want " + strings.Join(a.answers, " ")
	}

	if a.counts != nil && b.counts != nil {
		for k, n := range a.counts {
			if b.counts[k] != n {
				return "layer " + k + " counts " + strconv.FormatInt(b.counts[k], 10) + ", want " + strconv.FormatInt(n, 10)
			}
		}
	}

	return ""
}

func runCell(t *testing.T, name string, row mxRow, store mxStore, conf func(*Config), path string, fault mxFault) *mxResult {
	t.Helper()

	c := &mxCell{t: t, row: row, store: store, conf: conf, path: path, be: &mxBackend{holds: map[string]*mxHold{}}, seeing: &mxSeen{saw: map[string]*mxSaw{}}}
	if fault.prepare != nil {
		fault.prepare(c)
	}

	c.h = c.instance(c.conf)
	first := c.h

	if fault.script != nil {
		fault.script(c)
	} else {
		const at = 1 // the faulted request: the second, after one that set up the window
		for i, q := range row.script {
			if i == at {
				fault.run(c, q)
			} else {
				c.send(c.h, q, "")
			}
		}
	}

	first.quiet()
	if fault.settle != nil {
		fault.settle(c)
	}

	failed := false
	fail := func(format string, args ...interface{}) {
		failed = true
		t.Errorf(name+": "+format, args...)
	}

	mxCheckHeld(c, fail)
	counts := mxCheckCounts(c, fault, fail)

	if rec := c.h.get("/health", "203.0.113.77:1"); rec.Code != http.StatusOK {
		fail("Traefik no longer serves: GET /health answered %d", rec.Code)
	}

	for _, h := range c.insts {
		h.cancel()
	}

	if !waitCond(func() bool { return len(strayGoroutines()) == 0 }) {
		fail("goroutines left behind in the plugin's code:\n%s", strings.Join(strayGoroutines(), "\n\n"))
	}

	if failed {
		return nil
	}

	res := &mxResult{name: name, counts: counts}
	for _, s := range c.sent {
		res.answers = append(res.answers, strconv.Itoa(s.code)+"/"+s.left)
	}

	return res
}

// waitCond polls cond for up to 2s (goroutines ending after a context's
// cancellation).
func waitCond(cond func() bool) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}

	return cond()
}

// routeLayers are h's route layers (a route's plans' too).
func routeLayers(h *harness) []*rule.Layer {
	var out []*rule.Layer
	for _, l := range h.p.layers {
		switch l.Name {
		case "global", "ip", "assets", "user", "service", "pro":
		default:
			out = append(out, l)
		}
	}

	return out
}

// mxCheckHeld: every instance's reservations back to 0, and requests in
// flight on concurrency layers (in memory, on the status page, in Redis).
func mxCheckHeld(c *mxCell, fail func(string, ...interface{})) {
	for i, h := range c.insts {
		for _, rt := range h.p.routes {
			if n := atomic.LoadInt64(&rt.layer.Stats.Reserved); n != 0 {
				fail("instance %d: route %s holds %d reservations", i, rt.layer.Name, n)
			}
		}

		for _, l := range routeLayers(h) {
			if l.Algorithm != limit.Concurrency {
				continue
			}

			now := h.clock.Now().UnixNano()
			h.p.memory.Mu.Lock()
			for key, w := range h.p.memory.Maps[l.Name] {
				if n := memstore.HeldAt(w, now); n != 0 {
					fail("instance %d: %s/%s holds %d slots in memory", i, l.Name, key, n)
				}
			}
			h.p.memory.Mu.Unlock()

			if c.redis[i] {
				for _, k := range redisDo(c.t, c.admin(), "KEYS", l.RedisKey+"*").Array {
					if redisDo(c.t, c.admin(), "TYPE", k.Str).Str == "zset" {
						if n := redisDo(c.t, c.admin(), "ZCARD", k.Str).Int; n != 0 {
							fail("instance %d: %s holds %d slots in Redis", i, k.Str, n)
						}
					}
				}
			}
		}
	}

	doc := c.h.status("/_tl")
	for _, it := range doc.Keys.Items {
		for _, l := range routeLayers(c.h) {
			if l.Algorithm == limit.Concurrency && it.Layer == l.Name && it.Count != 0 {
				fail("the status page shows %s/%s with %d in flight", it.Layer, it.Key, it.Count)
			}
		}
	}

	rec := c.h.get("/_tl", local)
	if strings.Contains(rec.Body.String(), `"reserved":`) && !strings.Contains(rec.Body.String(), `"reserved":0`) {
		fail("the status page shows reservations held: %s", rec.Body.String())
	}
}

// mxCheckCounts compares the route layers' counts with what the requests
// charged by what their answers reported, in Redis for the requests
// instances on Redis admitted, in memory when no instance was on Redis;
// and no layer above its points. It returns the counts by layer.
func mxCheckCounts(c *mxCell, fault mxFault, fail func(string, ...interface{})) map[string]int64 {
	var want [2]int64 // memory, Redis
	for _, s := range c.sent {
		kind := 0
		if c.redis[s.inst] {
			kind = 1
		}
		want[kind] += c.row.charge(s.q, c.seeing.get(s.id))
	}

	if fault.script != nil {
		// The clock faults: over both replicas, the window admits its points.
		bound := int64(0)
		for _, l := range routeLayers(c.h) {
			bound += (l.Capacity + c.row.over) * c.row.charge(mxReq{}, mxSaw{reached: true, header: 1, body: 1})
		}
		if c.row.charge(mxReq{}, mxSaw{reached: true, header: 1, body: 1}) != 0 && want[1] > bound {
			fail("the replicas admitted %d points over their window, more than %d", want[1], bound)
		}
		return nil
	}

	if c.row.uncounted {
		return nil
	}

	got := map[string]int64{}
	var total [2]int64

	anyRedis := false
	for i, h := range c.insts {
		if c.redis[i] {
			anyRedis = true
			if rs := h.p.stores.redis; rs.Synced != nil {
				// Tried again after a back-off, as the sync loop's next tick
				// would: after Redis's restart, a pooled connection it closed
				// fails the first try.
				if !waitCond(func() bool { return redisstore.SyncNow(rs.Synced, h.clock.Now().UnixNano(), true) == nil }) {
					fail("the last sync: %v", redisstore.SyncNow(rs.Synced, h.clock.Now().UnixNano(), true))
				}
			}
		}
	}

	seen := map[string]bool{}
	for i, h := range c.insts {
		for _, l := range routeLayers(h) {
			if c.redis[i] && !seen["r"+l.RedisKey] {
				seen["r"+l.RedisKey] = true
				n := mxRedisCount(c.t, c.admin(), l.RedisKey, h.p.stores.redis.Synced != nil)
				got[l.Name] += n
				total[1] += n
			}
			if !c.redis[i] && !anyRedis && !seen["m"+l.Name] {
				seen["m"+l.Name] = true
				h.p.memory.Mu.Lock()
				for _, w := range h.p.memory.Maps[l.Name] {
					got[l.Name] += w.Count
					total[0] += w.Count
				}
				h.p.memory.Mu.Unlock()
			}
			if n := got[l.Name]; n > l.Capacity+c.row.over && l.Algorithm != limit.Concurrency {
				fail("layer %s counts %d, over its %d points", l.Name, n, l.Capacity)
			}
		}
	}

	if fault.noCounts {
		// Redis lost what it had: its counts are what came after, and the
		// outage's payments (redisstore/owed.go); only the bound holds.
		return got
	}

	if anyRedis && total[1] != want[1] {
		fail("Redis counts %d, the answers reported %d (%v)", total[1], want[1], got)
	}

	if !anyRedis && total[0] != want[0] {
		fail("memory counts %d, the answers reported %d (%v)", total[0], want[0], got)
	}

	return got
}

// mxRedisCount sums the counts of the keys of a layer (prefix): a
// window's counter, a sliding window's current count; synced, only the
// windows' keys (ending with the window's start), which the replicas
// lease from.
func mxRedisCount(t *testing.T, admin *redisresp.Pool, prefix string, synced bool) int64 {
	total := int64(0)
	for _, v := range redisDo(t, admin, "KEYS", prefix+"*").Array {
		if synced {
			if _, err := strconv.ParseInt(v.Str[strings.LastIndexByte(v.Str, ':')+1:], 10, 64); err != nil {
				continue
			}
		}

		var n int64
		switch redisDo(t, admin, "TYPE", v.Str).Str {
		case "hash":
			n, _ = strconv.ParseInt(redisDo(t, admin, "HGET", v.Str, "c").Str, 10, 64)
		case "string":
			if !strings.HasSuffix(v.Str, ":block") {
				n, _ = strconv.ParseInt(redisDo(t, admin, "GET", v.Str).Str, 10, 64)
			}
		}
		total += n
	}

	return total
}
