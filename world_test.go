package tierlimit

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The world as Traefik runs the plugin, for any test: an http.Server in
// front (the entrypoint), the plugin, then httputil.ReverseProxy to a
// backend server (Traefik's proxy is one). When the client goes while the
// proxy copies the response body, the proxy panics with
// http.ErrAbortHandler through the plugin's ServeHTTP, as Traefik's does;
// code after next.ServeHTTP without a defer never runs then. A reload swaps
// the instance the front serves and cancels the old instance's context, as
// Traefik does, while requests in flight finish on the old one. A replica
// (another Traefik on the same Redis) may run its clock ahead or behind.
//
// newProxiedHarness is newHarness in that world: h.do goes over the
// network (the client's address in X-Forwarded-For, which the front's
// loopback peer is trusted to set) and returns when the request's handler
// has ended; h.open holds a request open to read its answer bit by bit or
// hang up.

// front is the entrypoint of a proxied harness: the server, the instance
// it serves now, and the requests in flight.
type front struct {
	srv *httptest.Server
	be  *httptest.Server // the backend behind the plugin's proxy

	mu      sync.Mutex
	serving http.Handler
	active  int
	ended   map[string]chan struct{} // by harness request id, closed when its handler has returned
	idle    *sync.Cond

	seq    atomic.Int64
	client *http.Client

	// cancels, by harness request id: closing the channel cancels that
	// request's context at the front (cancelled).
	cancels map[string]chan struct{}
}

// reqIDHeader carries the harness's id of a request, so that its client
// can wait for its handler to end.
const reqIDHeader = "X-Harness-Request"

// newProxiedHarness is newHarness behind the front and before the proxy.
func newProxiedHarness(t *testing.T, mutate func(c *Config)) *harness {
	t.Helper()

	return behindProxy(t, newHarness(t, mutate))
}

// behindProxy puts harness h (newHarness, redisHarness...) in the world
// of newProxiedHarness: its backend behind the proxy, the front before it.
func behindProxy(t *testing.T, h *harness) *harness {
	t.Helper()

	origin := h.p.next

	f := &front{ended: map[string]chan struct{}{}, cancels: map[string]chan struct{}{}}
	f.idle = sync.NewCond(&f.mu)
	f.serving = h.h

	f.be = httptest.NewServer(origin)
	t.Cleanup(f.be.Close)

	target, _ := url.Parse(f.be.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	// As Traefik's transport: the client's Accept-Encoding goes through, the
	// answer comes back as the backend encoded it.
	proxy.Transport = &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64}
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	h.p.next = proxy

	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serveHTTP))
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	f.srv.Start()
	t.Cleanup(f.srv.Close)

	f.client = &http.Client{Transport: &http.Transport{DisableCompression: true}}
	h.front = f

	return h
}

func (f *front) serveHTTP(rw http.ResponseWriter, req *http.Request) {
	id := req.Header.Get(reqIDHeader)

	f.mu.Lock()
	f.active++
	serving := f.serving
	cancelOn := f.cancels[id]
	delete(f.cancels, id)
	f.mu.Unlock()

	if cancelOn != nil {
		// What a timeout middleware before the plugin, or Traefik's own
		// shutdown, does: the request's context ends, its client stays.
		ctx, cancel := context.WithCancel(req.Context())
		defer cancel()

		go func() {
			select {
			case <-cancelOn:
				cancel()
			case <-ctx.Done():
			}
		}()

		req = req.WithContext(ctx)
	}

	// Runs when the proxy aborts too: net/http recovers the panic after.
	defer func() {
		f.mu.Lock()
		f.active--
		if ch := f.ended[id]; ch != nil {
			close(ch)
			delete(f.ended, id)
		}
		f.idle.Broadcast()
		f.mu.Unlock()
	}()

	serving.ServeHTTP(rw, req)
}

// expect registers a request id, whose channel closes when its handler ends.
func (f *front) expect() (string, chan struct{}) {
	id := strconv.FormatInt(f.seq.Add(1), 10)
	ch := make(chan struct{})

	f.mu.Lock()
	f.ended[id] = ch
	f.mu.Unlock()

	return id, ch
}

// waitEnded waits for a request's handler to return (however it ended).
func waitEnded(t *testing.T, ch chan struct{}, what string) {
	t.Helper()

	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: the handler did not return", what)
	}
}

// quiet waits until no request is in flight at the front.
func (h *harness) quiet() {
	h.t.Helper()

	f := h.front
	stop := time.AfterFunc(20*time.Second, func() {
		f.mu.Lock()
		f.active = -f.active - 1 // marks the timeout; restored below
		f.idle.Broadcast()
		f.mu.Unlock()
	})
	defer stop.Stop()

	f.mu.Lock()
	defer f.mu.Unlock()

	for f.active > 0 {
		f.idle.Wait()
	}

	if f.active < 0 {
		f.active = -f.active - 1
		h.t.Fatalf("%d requests still in flight at the front", f.active)
	}
}

// bodyHeader in the headers a harness request is given is not a header:
// its value is the request's body, sent with its Content-Length (for any
// of do, open, doUntil).
const bodyHeader = "X-Harness-Body"

// newFrontRequest is a request to the front as a client at remote sends it.
func newFrontRequest(f *front, method, target, remote string, hdr map[string]string, body io.Reader) *http.Request {
	u, _ := url.Parse(target)

	if b, ok := hdr[bodyHeader]; ok && body == nil {
		body = strings.NewReader(b)
	}

	req, err := http.NewRequest(method, f.srv.URL+u.RequestURI(), body)
	if err != nil {
		panic(err)
	}

	if u.Host != "" {
		req.Host = u.Host
	}

	if host, _, err := net.SplitHostPort(remote); err == nil && host != "" && !strings.HasPrefix(host, "127.") {
		req.Header.Set("X-Forwarded-For", host)
	}

	for k, v := range hdr {
		if k != bodyHeader {
			req.Header.Set(k, v)
		}
	}

	return req
}

// doFront is harness.do through the front: it returns the answer as a
// recorder once the request's handler has returned.
func doFront(h *harness, method, target, remote string, hdr map[string]string) *httptest.ResponseRecorder {
	h.t.Helper()

	return h.send(method, target, remote, hdr, nil, 0)
}

// send is harness.do through the front with a request body: length bytes
// of body, sent with that Content-Length, or chunked when length is -1.
func (h *harness) send(method, target, remote string, hdr map[string]string, body io.Reader, length int64) *httptest.ResponseRecorder {
	h.t.Helper()

	f := h.front
	req := newFrontRequest(f, method, target, remote, hdr, body)
	if body != nil {
		req.ContentLength = length
	}
	id, ended := f.expect()
	req.Header.Set(reqIDHeader, id)

	res, err := f.client.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, target, err)
	}

	answer, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()

	waitEnded(h.t, ended, method+" "+target)

	rec := httptest.NewRecorder()
	for k, v := range res.Header {
		rec.Header()[k] = v
	}

	for k, v := range res.Trailer {
		rec.Header()[k] = v
	}

	rec.Code = res.StatusCode
	rec.Body = bytes.NewBuffer(answer)

	return rec
}

// doUntil is harness.do through the front, for a request that ends early:
// when cancel is "client", the client gives up when stop closes (its
// timeout); when "context", the request's context at the front is cancelled
// then while its client waits for the answer. It returns the answer's status
// (0 when the client had none) once the request's handler has returned.
func (h *harness) doUntil(method, target, remote string, hdr map[string]string, cancel string, stop chan struct{}) int {
	h.t.Helper()

	f := h.front
	req := newFrontRequest(f, method, target, remote, hdr, nil)
	id, ended := f.expect()
	req.Header.Set(reqIDHeader, id)

	switch cancel {
	case "client":
		ctx, cancelClient := context.WithCancel(context.Background())
		defer cancelClient()

		go func() {
			select {
			case <-stop:
				cancelClient()
			case <-ctx.Done():
			}
		}()

		req = req.WithContext(ctx)
	case "context":
		f.mu.Lock()
		f.cancels[id] = stop
		f.mu.Unlock()
	default:
		h.t.Fatalf("doUntil: cancel %q is neither client nor context", cancel)
	}

	code := 0

	if res, err := f.client.Do(req); err == nil {
		code = res.StatusCode
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
	}

	waitEnded(h.t, ended, method+" "+target)

	return code
}

// openRequest is a request held open on a connection of its own: its
// client reads the answer when the test says, or hangs up.
type openRequest struct {
	t     *testing.T
	conn  net.Conn
	br    *bufio.Reader
	req   *http.Request
	res   *http.Response
	ended chan struct{}
	what  string
}

// open sends a request to the front and returns before reading anything.
func (h *harness) open(method, target, remote string, hdr map[string]string) *openRequest {
	h.t.Helper()

	f := h.front
	req := newFrontRequest(f, method, target, remote, hdr, nil)
	id, ended := f.expect()
	req.Header.Set(reqIDHeader, id)

	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		h.t.Fatal(err)
	}

	if err := req.Write(conn); err != nil {
		h.t.Fatal(err)
	}

	return &openRequest{t: h.t, conn: conn, br: bufio.NewReader(conn), req: req, ended: ended, what: method + " " + target}
}

// head reads the answer's status and headers.
func (o *openRequest) head() *http.Response {
	o.t.Helper()

	if o.res == nil {
		res, err := http.ReadResponse(o.br, o.req)
		if err != nil {
			o.t.Fatalf("%s: reading the answer: %v", o.what, err)
		}

		o.res = res
	}

	return o.res
}

// readUntil reads the body until it has read s (an event's end, say).
func (o *openRequest) readUntil(s string) string {
	o.t.Helper()

	var got bytes.Buffer

	b := make([]byte, 1)
	for !strings.HasSuffix(got.String(), s) {
		if _, err := o.head().Body.Read(b); err != nil {
			o.t.Fatalf("%s: the body ended before %q (read %q): %v", o.what, s, got.String(), err)
		}

		got.WriteByte(b[0])
	}

	return got.String()
}

// readAll reads the rest of the body.
func (o *openRequest) readAll() string {
	o.t.Helper()

	b, _ := io.ReadAll(o.head().Body)

	return string(b)
}

// hangUp closes the client's connection: the front cancels the request's
// context, and the proxy, copying a body, panics with http.ErrAbortHandler.
func (o *openRequest) hangUp() {
	_ = o.conn.Close()
}

// wait waits for the request's handler to return, however it ended.
func (o *openRequest) wait() {
	o.t.Helper()
	waitEnded(o.t, o.ended, o.what)
	_ = o.conn.Close()
}

// stepBackend answers each request with a body the test writes step by
// step: a test takes the request's steps from reqs, sends each chunk, and
// ends the answer with end (or leaves it hanging until the client goes).
type stepBackend struct {
	header http.Header // copied onto each answer before its status
	status int
	reqs   chan *steps
}

// steps is one answer of a stepBackend in progress.
type steps struct {
	req    *http.Request
	chunks chan string
	done   chan struct{}
	gone   chan struct{} // closed when the backend's handler has returned
}

func newStepBackend(contentType string) *stepBackend {
	return &stepBackend{header: http.Header{"Content-Type": {contentType}}, status: http.StatusOK, reqs: make(chan *steps, 64)}
}

func (b *stepBackend) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	s := &steps{req: req, chunks: make(chan string), done: make(chan struct{}), gone: make(chan struct{})}
	defer close(s.gone)

	for k, v := range b.header {
		rw.Header()[k] = v
	}

	rw.WriteHeader(b.status)
	if f, ok := rw.(http.Flusher); ok {
		f.Flush()
	}

	b.reqs <- s

	for {
		select {
		case chunk := <-s.chunks:
			_, _ = io.WriteString(rw, chunk)
			if f, ok := rw.(http.Flusher); ok {
				f.Flush()
			}
		case <-s.done:
			return
		case <-req.Context().Done():
			return
		}
	}
}

// next is the next request's answer in progress.
func (b *stepBackend) next(t *testing.T) *steps {
	t.Helper()

	select {
	case s := <-b.reqs:
		return s
	case <-time.After(20 * time.Second):
		t.Fatal("no request reached the backend")
		return nil
	}
}

// send writes a chunk of the answer (the client reads it when it will).
func (s *steps) send(chunk string) {
	select {
	case s.chunks <- chunk:
	case <-s.gone:
	}
}

// end ends the answer.
func (s *steps) end() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
}

// reloaded is the instance Traefik builds at a reload, with the same
// name: the old instance's context is cancelled, the front (if any) serves
// the new one from the next request on, and requests in flight finish on
// the old one. The new instance shares the clock and the events buffer.
func reloaded(t *testing.T, h *harness, mutate func(c *Config)) *harness {
	t.Helper()

	cfg := CreateConfig()
	if mutate != nil {
		mutate(cfg)
	}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	handler, err := New(ctx, h.p.next, cfg, h.p.name)
	if err != nil {
		t.Fatalf("New: %v", err)
	}

	r := &harness{t: t, h: handler, p: pluginOf(handler), clock: h.clock, events: h.events, cancel: cancel, backend: h.backend, front: h.front}
	r.p.now = r.clock.Now
	logEventsTo(r.p, r.events, r.p.name, r.clock.Now)

	if h.front != nil {
		h.front.mu.Lock()
		h.front.serving = handler
		h.front.mu.Unlock()
	}

	if h.cancel != nil {
		h.cancel()
	}

	return r
}

// pluginLoops are the functions whose goroutines the plugin starts to run
// for an instance's or a backend's life (not a request's): synced counting,
// the reset subscription, an outage's payments, Sentinel, each named by the
// function that starts it; and the probe, named by its own function: the
// backend's first failure starts it, whichever goroutine that is in (a
// request's, synced counting's), and it lives while the backend is held,
// past its instances by lifetime.ReleaseGrace.
var pluginLoops = []string{"redisstore.StartSync", "redisstore.(*resetListener).Listen", "redisstore.(*BackendRegistry)", "redisstore.NewBackend", "redisresp.(*sentinel"}

const probeLoop = "redisstore.probeRedis("

// strayGoroutines describes the goroutines running the plugin's non-test
// code other than its loops (pluginLoops): once no request is in flight,
// there are none (a request's handler, or a goroutine a request started,
// left waiting is one).
func strayGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}

		buf = make([]byte, 2*len(buf))
	}

	var stray []string

	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(g, "\n")
		loop, inPlugin := false, false

		for i := 1; i+1 < len(lines); i += 2 {
			fn, file := lines[i], lines[i+1]
			if strings.HasPrefix(fn, "created by ") {
				for _, l := range pluginLoops {
					loop = loop || strings.Contains(fn, l)
				}

				continue
			}

			loop = loop || strings.Contains(fn, probeLoop)
			inPlugin = inPlugin || strings.HasPrefix(fn, "github.com/tierlimit/tierlimit") && !strings.Contains(file, "_test.go")
		}

		if inPlugin && !loop {
			stray = append(stray, g)
		}
	}

	return stray
}

// TestTheProxiedHarnessAbortsAsTraefikDoes: a client that hangs up in the
// middle of a streamed answer makes the proxy behind the plugin panic with
// http.ErrAbortHandler, and the front sees the handler end.
func TestTheProxiedHarnessAbortsAsTraefikDoes(t *testing.T) {
	h := newProxiedHarness(t, onlyIP(10, "60s"))
	sb := newStepBackend("text/event-stream")
	h.backend = sb

	var recovered atomic.Value

	proxy := h.p.next
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				recovered.Store(v)
				panic(v)
			}
		}()
		proxy.ServeHTTP(rw, req)
	})

	o := h.open(http.MethodGet, "/stream", "203.0.113.1:1", nil)
	s := sb.next(t)
	s.send("data: one\n\n")

	if got := o.readUntil("\n\n"); got != "data: one\n\n" {
		t.Fatalf("first event %q", got)
	}

	o.hangUp()
	o.wait()
	<-s.gone

	if v := recovered.Load(); v != http.ErrAbortHandler {
		t.Fatalf("the proxy ended with %v, want a panic with http.ErrAbortHandler", v)
	}

	h.backend = nil

	if rec := h.get("/api", "203.0.113.1:1"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "8" {
		t.Fatalf("after the hang-up: %d remaining %q, want 200 and 8", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
}

// chainedBefore is another middleware of the plugin placed before h's
// instance in the same router's chain (an edge before ForwardAuth and a
// principal instance, ForwardAuth left out: it passes the writer on), built
// from mutate and named name; the front serves it. Its events go to h's
// buffer, under its own name.
func chainedBefore(t *testing.T, h *harness, mutate func(c *Config), name string) *Plugin {
	t.Helper()

	cfg := CreateConfig()
	if mutate != nil {
		mutate(cfg)
	}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	handler, err := New(ctx, h.h, cfg, name)
	if err != nil {
		t.Fatalf("New: %v", err)
	}

	p := pluginOf(handler)
	p.now = h.clock.Now
	logEventsTo(p, h.events, name, h.clock.Now)

	if h.front != nil {
		h.front.mu.Lock()
		h.front.serving = handler
		h.front.mu.Unlock()
	}

	return p
}

// chained places instance b after instance a in a's chain, as
// router.middlewares [a, between, b] does: a's next becomes between (a
// ForwardAuth, say; nil: none) around b, and b's next what a's was (the
// proxy of a proxied harness). b runs on a's clock; requests go through a
// (its front, when a is proxied).
func chained(a *harness, between func(next http.Handler) http.Handler, b *harness) {
	b.p.next = a.p.next

	var h http.Handler = b.h
	if between != nil {
		h = between(h)
	}

	a.p.next = h
	b.clock = a.clock
	b.p.now = a.clock.Now
	b.p.events.Now = a.clock.Now
}

// fakeForwardAuth is Traefik's ForwardAuth as the recommended chain
// configures it: a request whose Authorization is "Bearer <user>" goes on
// with X-Auth-User: <user> (which a client cannot set itself); one without
// goes on anonymous.
func fakeForwardAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		req.Header.Del("X-Auth-User")
		if user, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer "); ok && user != "" {
			req.Header.Set("X-Auth-User", user)
		}

		next.ServeHTTP(rw, req)
	})
}
