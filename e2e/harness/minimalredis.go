package harness

// MinimalRedis is the least code that meets the contract of tierlimit's
// Redis edge for an anonymous request: the global and the client's ip fixed
// windows charged in one round trip (one EVALSHA of a script doing what
// tierlimit's does for a fixed window: SET NX PX, INCR, PTTL per key, in
// order, stopping at a refusal), the command encoded once but for the
// client's key, the integer reply read with bounded reads (a bufio.Reader of
// 512 bytes, at most four elements), the five headers of the window with the
// fewest requests left, and the refusal as the README answers it (429,
// Retry-After, no-store, the JSON body). NOSCRIPT loads the script with
// EVAL. A failed call decides the request in memory (never fail open),
// which is the one thing it shares with tierlimit's fallback; it has no
// back-off, no events and no block list. Connections are dialled on demand
// and at most 16 idle ones are kept. It is the floor tierlimit's Redis
// figures are judged against (BENCHMARKS.md); it is not this plugin.
var MinimalRedis = LocalPlugin{
	Alias:  "minimalredis",
	Module: "example.com/minimalredis",
	Files: map[string]string{
		".traefik.yml": "displayName: minimalredis\ntype: middleware\nimport: example.com/minimalredis\nsummary: baseline\ntestData: {}\n",
		"go.mod":       "module example.com/minimalredis\n\ngo 1.22\n",
		"minimalredis.go": `package minimalredis

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

type Config struct {
	Address string
	Points  int64
	Seconds int64
}

func CreateConfig() *Config { return &Config{Address: "127.0.0.1:6379", Points: 100000000, Seconds: 1} }

const script = "local out = {}\n" +
	"for i = 1, #KEYS do\n" +
	"  redis.call('SET', KEYS[i], 0, 'NX', 'PX', ARGV[2 * i])\n" +
	"  local c = redis.call('INCR', KEYS[i])\n" +
	"  out[#out + 1] = c\n" +
	"  out[#out + 1] = redis.call('PTTL', KEYS[i])\n" +
	"  if c > tonumber(ARGV[2 * i - 1]) then break end\n" +
	"end\n" +
	"return out\n"

const timeout = int64(100 * time.Millisecond)

type conn struct {
	nc       net.Conn
	br       *bufio.Reader
	broken   bool
	noScript bool
}

type layer struct {
	name   string
	points int64
	limit  []string
	policy []string
}

type window struct {
	count, reset int64
}

type handler struct {
	next     http.Handler
	addr     string
	duration int64
	global   *layer
	ip       *layer
	evalsha  string
	eval     string
	prefix   string
	args     string
	json     []string
	noStore  []string
	mu       sync.Mutex
	idle     []*conn
	local    map[string]*window
}

func bulk(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }

func newLayer(name string, points, seconds int64) *layer {
	limit := strconv.FormatInt(points, 10)
	return &layer{name: name, points: points, limit: []string{limit},
		policy: []string{"\"" + name + "\";q=" + limit + ";w=" + strconv.FormatInt(seconds, 10)}}
}

func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	sum := sha1.Sum([]byte(script))
	ms := strconv.FormatInt(config.Seconds*1000, 10)
	keys := bulk("2") + bulk("minimalredis:"+name+":global")
	return &handler{next: next, addr: config.Address, duration: config.Seconds * 1e9,
		global: newLayer("global", 1000000000, config.Seconds), ip: newLayer("ip", config.Points, config.Seconds),
		evalsha: "*9\r\n$7\r\nEVALSHA\r\n" + bulk(hex.EncodeToString(sum[:])) + keys,
		eval:    "*9\r\n$4\r\nEVAL\r\n" + bulk(script) + keys,
		prefix:  "minimalredis:" + name + ":ip:",
		args:    bulk("1000000000") + bulk(ms) + bulk(strconv.FormatInt(config.Points, 10)) + bulk(ms),
		json:    []string{"application/json"}, noStore: []string{"no-store"}, local: map[string]*window{}}, nil
}

func (h *handler) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	key := req.Header.Get("X-Forwarded-For")
	if key == "" {
		key = req.RemoteAddr[:strings.LastIndexByte(req.RemoteAddr, ':')]
	}
	now := time.Now().UnixNano()
	args := "$" + strconv.Itoa(len(h.prefix)+len(key)) + "\r\n" + h.prefix + key + "\r\n" + h.args
	var c *conn
	h.mu.Lock()
	if n := len(h.idle); n > 0 {
		c = h.idle[n-1]
		h.idle = h.idle[:n-1]
	}
	h.mu.Unlock()
	var reply []int64
	if c != nil {
		reply = c.run(h.evalsha+args, now)
	}
	if reply == nil {
		reply = h.slow(c, args, key, now)
	} else {
		h.put(c)
	}
	shown, count, ttl := h.global, reply[0], reply[1]
	if count <= h.global.points && (reply[2] > h.ip.points || h.ip.points-reply[2] < h.global.points-count) {
		shown, count, ttl = h.ip, reply[2], reply[3]
	}
	reset := now + ttl*1e6
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

// run sends cmd and reads a reply of two or four integers (a refusal by
// global stops the script after its pair); nil on anything else.
func (c *conn) run(cmd string, now int64) []int64 {
	c.nc.SetDeadline(time.Unix(0, now+timeout))
	if _, err := io.WriteString(c.nc, cmd); err != nil {
		c.broken = true
		return nil
	}
	line, err := c.br.ReadSlice('\n')
	if err == nil && len(line) > 9 && string(line[:9]) == "-NOSCRIPT" {
		c.noScript = true
		return nil
	}
	if err != nil || len(line) != 4 || line[0] != '*' || line[1] != '2' && line[1] != '4' {
		c.broken = true
		return nil
	}
	out := []int64{0, 0, 0, 0}
	for i := 0; i < int(line[1]-'0'); i++ {
		b, err := c.br.ReadSlice('\n')
		if err != nil || len(b) < 4 || b[0] != ':' {
			c.broken = true
			return nil
		}
		v, err := strconv.ParseInt(string(b[1:len(b)-2]), 10, 64)
		if err != nil {
			c.broken = true
			return nil
		}
		out[i] = v
	}
	return out
}

func (h *handler) put(c *conn) {
	h.mu.Lock()
	if len(h.idle) < 16 {
		h.idle = append(h.idle, c)
		c = nil
	}
	h.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// slow dials when no connection was idle or the last one broke, loads the
// script on NOSCRIPT, and decides in memory when Redis fails.
func (h *handler) slow(c *conn, args, key string, now int64) []int64 {
	if c != nil && c.broken {
		c.nc.Close()
		c = nil
	}
	if c == nil {
		nc, err := net.DialTimeout("tcp", h.addr, time.Duration(timeout))
		if err != nil {
			return h.fallback(key, now)
		}
		c = &conn{nc: nc, br: bufio.NewReaderSize(nc, 512)}
	}
	reply := c.run(h.evalsha+args, now)
	if reply == nil && c.noScript {
		c.noScript = false
		reply = c.run(h.eval+args, now)
	}
	if reply == nil {
		c.nc.Close()
		return h.fallback(key, now)
	}
	h.put(c)
	return reply
}

func (h *handler) fallback(key string, now int64) []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []int64{0, 0, 0, 0}
	for i, k := range []string{"global", "ip:" + key} {
		w := h.local[k]
		if w == nil || w.reset <= now {
			w = &window{reset: now + h.duration}
			h.local[k] = w
		}
		w.count++
		out[2*i] = w.count
		out[2*i+1] = (w.reset - now) / 1e6
		if i == 0 && w.count > h.global.points {
			break
		}
	}
	return out
}
`,
	},
}
