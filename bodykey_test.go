package tierlimit

import (
	"bytes"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/request"
)

// chatBody is a Chat Completions request as the SDKs write it: the
// messages (pad bytes of them), then the model.
func chatBody(model string, pad int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"messages":[`)
	for n := 0; b.Len() < pad; n++ {
		if n > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"role":"user","content":"` + strings.Repeat("tell me more ", 80) + `"}`)
	}
	b.WriteString(`],"model":"` + model + `","stream":false}`)

	return b.Bytes()
}

// bodySink is a backend that keeps the digest and length of each body it
// received, and how it was sent.
type bodySink struct {
	mu     sync.Mutex
	got    [][32]byte
	sizes  []int64
	length []int64 // the request's ContentLength as the backend saw it
}

func (s *bodySink) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	d := sha256.New()
	n, _ := io.Copy(d, req.Body)

	var sum [32]byte
	copy(sum[:], d.Sum(nil))

	s.mu.Lock()
	s.got = append(s.got, sum)
	s.sizes = append(s.sizes, n)
	s.length = append(s.length, req.ContentLength)
	s.mu.Unlock()

	_, _ = rw.Write([]byte("ok"))
}

func (s *bodySink) last() ([32]byte, int64, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()

	i := len(s.got) - 1

	return s.got[i], s.sizes[i], s.length[i]
}

// modelRoute is a route of 2 requests a minute per API key per model.
func modelRoute(key string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.Routes = []config.RouteConfig{{Name: "llm", Methods: []string{"POST"}, Paths: []string{"/v1/chat/completions"}, Key: key, Points: 2, Duration: "60s"}}
	}
}

// A route keyed by "header:X-Api-Key,json:model" keeps a budget per API
// key per model, the model read after 150 KB of messages, with and without
// a Content-Length: alice's gpt-4o calls touch neither her gpt-4o-mini
// budget nor bob's. The backend receives each body as sent. On memory,
// exact Redis and synced Redis.
func TestARouteKeyedByTheModelKeepsABudgetPerKeyPerModel(t *testing.T) {
	addr, _ := redisServer(t)
	stores := []struct {
		name string
		make func(t *testing.T, mutate func(c *Config)) *harness
	}{
		{"memory", newProxiedHarness},
		{"exact Redis", func(t *testing.T, mutate func(c *Config)) *harness {
			h, _ := redisHarness(t, addr, with(mutate, asACLUser))
			return behindProxy(t, h)
		}},
		{"synced Redis", func(t *testing.T, mutate func(c *Config)) *harness {
			h, _, _ := syncHarness(t, addr, with(mutate, asACLUser))
			return behindProxy(t, h)
		}},
	}

	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			h := st.make(t, modelRoute("header:X-Api-Key,json:model"))
			sink := &bodySink{}
			h.backend = sink

			steps := []struct {
				key, model string
				want       int
			}{
				{"alice", "gpt-4o", 200}, {"alice", "gpt-4o", 200}, {"alice", "gpt-4o", 429},
				{"alice", "gpt-4o-mini", 200}, {"bob", "gpt-4o", 200}, {"alice", "gpt-4o-mini", 200},
				{"alice", "gpt-4o-mini", 429}, {"bob", "gpt-4o", 200}, {"bob", "gpt-4o", 429},
			}

			for i, s := range steps {
				body := chatBody(s.model, 150<<10)
				length := int64(len(body))
				if i%2 == 1 {
					length = -1 // chunked
				}

				rec := h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", map[string]string{"X-Api-Key": s.key}, bytes.NewReader(body), length)
				if rec.Code != s.want {
					t.Fatalf("request %d (%s, %s): %d, want %d", i+1, s.key, s.model, rec.Code, s.want)
				}

				if s.want != 200 {
					continue
				}

				sum, n, cl := sink.last()
				if sum != sha256.Sum256(body) || n != int64(len(body)) || cl != length {
					t.Fatalf("request %d: the backend got %d bytes (Content-Length %d), want the %d sent (%d), unchanged: %v", i+1, n, cl, len(body), length, sum == sha256.Sum256(body))
				}
			}
		})
	}
}

// The key of a request whose body does not state the field is "unknown",
// one bucket, and such a body reaches the backend unchanged: not JSON, no
// model, a model that is not a string or number, a model beyond
// maxRequestBody. A number is a key as written.
func TestABodyWithoutTheFieldIsKeyedUnknown(t *testing.T) {
	h := newProxiedHarness(t, with(modelRoute("json:model"), func(c *Config) {
		c.Routes[0].Points = 100
		c.Routes[0].MaxRequestBody = "64KiB"
	}))
	sink := &bodySink{}
	h.backend = sink

	for _, c := range []struct {
		body, key string
	}{
		{"model=gpt-4o", "unknown"},
		{`{"messages":[]}`, "unknown"},
		{`{"model":["gpt-4o"]}`, "unknown"},
		{string(chatBody("gpt-4o", 100<<10)), "unknown"},
		{`{"model":4e2}`, "4e2"},
		{`{"model":"` + strings.Repeat("m", 200) + `"}`, request.HashKey(strings.Repeat("m", 200))},
		{`{"model":"gpt\u002d4o"}`, "gpt-4o"},
	} {
		before, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", c.key)
		rec := h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", nil, strings.NewReader(c.body), int64(len(c.body)))
		after, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", c.key)

		if rec.Code != 200 || after != before+1 {
			t.Errorf("body %.40q: %d, key %q counts %d, want 200 and %d", c.body, rec.Code, c.key, after, before+1)
		}

		if sum, n, _ := sink.last(); sum != sha256.Sum256([]byte(c.body)) {
			t.Errorf("body %.40q: the backend got %d other bytes", c.body, n)
		}
	}
}

// genBody is a generated JSON body of size bytes, never held in memory:
// {"messages":["xxxx...","xxxx...",...]} padded with spaces to size.
type genBody struct {
	size, off int64
}

const genHead, genTail = `{"messages":["`, `"]}`

func (g *genBody) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}

	n := 0
	for n < len(p) && g.off < g.size {
		var c byte
		switch {
		case g.off < int64(len(genHead)):
			c = genHead[g.off]
		case g.off >= g.size-int64(len(genTail)):
			c = genTail[g.off-(g.size-int64(len(genTail)))]
		case g.off%1024 == 0:
			c = '"'
		case g.off%1024 == 1:
			c = ','
		case g.off%1024 == 2:
			c = '"'
		default:
			c = 'x'
		}
		p[n] = c
		n++
		g.off++
	}

	return n, nil
}

// genDigest is the digest and size of genBody{size}.
func genDigest(size int64) [32]byte {
	d := sha256.New()
	_, _ = io.Copy(d, &genBody{size: size})

	var sum [32]byte
	copy(sum[:], d.Sum(nil))

	return sum
}

// A 100 MB body on a json-keyed route costs bounded memory: at most
// maxRequestBody (1 MiB here), the bytes read before the body is known to
// be too long, and a megabyte more for the proxy and the servers; the
// backend receives all 100 MB unchanged, sent with their Content-Length
// (not read at all: too long) or chunked (read up to the bound).
func TestAHundredMegabyteBodyCostsBoundedMemory(t *testing.T) {
	const size = 100 << 20
	const bound = 1 << 20

	h := newProxiedHarness(t, with(modelRoute("header:X-Api-Key,json:model"), func(c *Config) {
		c.Routes[0].MaxRequestBody = "1MiB"
	}))
	sink := &bodySink{}
	h.backend = sink
	want := genDigest(size)

	for _, length := range []int64{size, -1} {
		// One request first, so that the connections and pools are warm.
		h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", map[string]string{"X-Api-Key": "k"}, strings.NewReader(`{"model":"m"}`), -1)

		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)

		rec := h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", map[string]string{"X-Api-Key": "k"}, &genBody{size: size}, length)

		runtime.ReadMemStats(&after)
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("Content-Length %d: %d bytes allocated for a %d-byte body", length, allocated, size)

		if rec.Code != 200 {
			t.Fatalf("Content-Length %d: %d", length, rec.Code)
		}

		if sum, n, _ := sink.last(); sum != want || n != size {
			t.Fatalf("Content-Length %d: the backend got %d bytes, want %d unchanged (same: %v)", length, n, size, sum == want)
		}

		if allocated > bound+1<<20 {
			t.Errorf("Content-Length %d: %d bytes allocated, want at most %d", length, allocated, bound+1<<20)
		}

		if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k")+"|unknown"); n == 0 {
			t.Errorf("Content-Length %d: not counted as unknown", length)
		}
	}
}

// A client that hangs up while its body is read: the request's key is
// "unknown", its handler returns, nothing of the plugin stays behind, and
// the next request is served.
func TestAClientHangingUpDuringItsBodyLeavesNothingBehind(t *testing.T) {
	h := newProxiedHarness(t, modelRoute("json:model"))

	for _, chunked := range []bool{false, true} {
		id, ended := h.front.expect()
		conn, err := net.Dial("tcp", h.front.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}

		head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + reqIDHeader + ": " + id + "\r\nContent-Type: application/json\r\n"
		part := `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 64<<10)
		if chunked {
			head += "Transfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(part)), 16) + "\r\n" + part + "\r\n"
		} else {
			head += "Content-Length: " + strconv.Itoa(1<<20) + "\r\n\r\n" + part
		}

		if _, err := conn.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
		_ = conn.Close()

		waitEnded(t, ended, "the request cut in its body")
	}

	h.quiet()

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", "unknown"); n != 2 {
		t.Errorf("the cut requests count %d in the unknown bucket, want 2", n)
	}

	if rec := h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", nil, strings.NewReader(`{"model":"m"}`), 13); rec.Code != 200 {
		t.Fatalf("the next request: %d", rec.Code)
	}

	h.cancel()
	if !waitCond(func() bool { return len(strayGoroutines()) == 0 }) {
		t.Fatalf("goroutines left behind:\n%s", strings.Join(strayGoroutines(), "\n\n"))
	}
}

// A countStatus route keyed by the body charges a listed status to the
// key the body named, read before the backend took the body: failed logins
// per username.
func TestAFailedLoginIsChargedToTheUsernameItNamed(t *testing.T) {
	h := newProxiedHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.Routes = []config.RouteConfig{{Name: "login", Methods: []string{"POST"}, Paths: []string{"/login"}, Key: "json:username", Points: 2, Duration: "60s", CountStatus: []int{401}}}
	})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		if !bytes.Contains(b, []byte(`"password":"right"`)) {
			rw.WriteHeader(http.StatusUnauthorized)
		}
	})

	login := func(user, password string) int {
		body := `{"username":"` + user + `","password":"` + password + `"}`
		return h.send(http.MethodPost, "/login", "203.0.113.5:1", nil, strings.NewReader(body), int64(len(body))).Code
	}

	for i, want := range []int{401, 401, 429} {
		if got := login("bob", "wrong"); got != want {
			t.Fatalf("bob's login %d: %d, want %d", i+1, got, want)
		}
	}

	if got := login("alice", "right"); got != 200 {
		t.Fatalf("alice's login: %d, want 200 (only bob's failures count against bob)", got)
	}

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "login", "bob"); n != 2 {
		t.Fatalf("bob's failures count %d, want 2", n)
	}
}

// A route's plan is keyed as the route is: with key header:X-Api-Key, each
// API key of a principal on the pro plan has the plan's 2 points on the
// route (the plan's layer once fell back to the client IP, one bucket for
// every key).
func TestARoutePlanIsKeyedAsItsRoute(t *testing.T) {
	h := newProxiedHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.User = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.Principal.UserHeader, c.Principal.PlanHeader = "X-Auth-User", "X-Auth-Plan"
		c.Plans = map[string]config.PlanConfig{"pro": {Points: 1000, Duration: "60s"}}
		c.Routes = []config.RouteConfig{{Name: "llm", Paths: []string{"/v1/"}, Key: "header:X-Api-Key", Points: 5, Duration: "60s",
			Plans: map[string]config.PlanConfig{"pro": {Points: 2, Duration: "60s"}}}}
	})

	for i, s := range []struct {
		key  string
		want int
	}{{"k1", 200}, {"k1", 200}, {"k1", 429}, {"k2", 200}, {"k2", 200}, {"k2", 429}} {
		rec := h.do(http.MethodPost, "/v1/chat", "203.0.113.5:1", map[string]string{"X-Auth-User": "carol", "X-Auth-Plan": "pro", "X-Api-Key": s.key})
		if rec.Code != s.want {
			t.Fatalf("request %d (%s): %d, want %d", i+1, s.key, rec.Code, s.want)
		}
	}
}
