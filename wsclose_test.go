package tierlimit

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/lifetime"
)

// The handshake example of RFC 6455, section 1.3.
const (
	rfcKey    = "dGhlIHNhbXBsZSBub25jZQ=="
	rfcAccept = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
)

// wsServer serves the plugin on a real listener, so that it can hijack.
func wsServer(t *testing.T, mutate func(c *Config), next http.Handler) *httptest.Server {
	t.Helper()

	cfg := CreateConfig()
	cfg.Global.Points = 0

	if mutate != nil {
		mutate(cfg)
	}

	h, err := New(context.Background(), next, cfg, t.Name()+"-"+strconv.FormatInt(instanceSeq.Add(1), 10)+"@test")
	if err != nil {
		t.Fatal(err)
	}

	pluginOf(h).events = events.NewEventLog(io.Discard, "test")
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	return srv
}

// upgrade sends a raw upgrade request and returns the response and the connection.
func upgrade(t *testing.T, srv *httptest.Server, key, version string) (*http.Response, *bufio.Reader, net.Conn) {
	t.Helper()

	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))

	req := "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n" +
		"Sec-WebSocket-Key: " + key + "\r\nSec-WebSocket-Version: " + version + "\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}

	br := bufio.NewReader(conn)

	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}

	return resp, br, conn
}

// readClose reads one server frame and returns its close status and reason.
func readClose(t *testing.T, br *bufio.Reader) (uint16, string) {
	t.Helper()

	hdr := make([]byte, 2)
	if _, err := io.ReadFull(br, hdr); err != nil {
		t.Fatal(err)
	}

	if hdr[0] != 0x88 || hdr[1]&0x80 != 0 {
		t.Fatalf("not an unmasked close frame: % x", hdr)
	}

	payload := make([]byte, int(hdr[1]))
	if _, err := io.ReadFull(br, payload); err != nil {
		t.Fatal(err)
	}

	return binary.BigEndian.Uint16(payload), string(payload[2:])
}

func TestRefusedUpgradeIsClosedWith1013(t *testing.T) {
	srv := wsServer(t, func(c *Config) { c.IP = config.LayerConfig{Points: 1, Duration: "60s"} },
		http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusTeapot) }))

	if resp, _, _ := upgrade(t, srv, rfcKey, "13"); resp.StatusCode != http.StatusTeapot {
		t.Fatalf("allowed upgrade: %d", resp.StatusCode)
	}

	resp, br, _ := upgrade(t, srv, rfcKey, "13")
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != rfcAccept ||
		!strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
		t.Fatalf("refused upgrade: %d %v", resp.StatusCode, resp.Header)
	}

	if resp.Header.Get("X-RateLimit-Limit") != "1" || resp.Header.Get("X-RateLimit-Remaining") != "0" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("handshake without the rate-limit headers: %v", resp.Header)
	}

	code, reason := readClose(t, br)
	if code != 1013 || !strings.Contains(reason, "ip") {
		t.Fatalf("close %d %q", code, reason)
	}
}

func TestMalformedRefusedUpgradeGetsA429(t *testing.T) {
	srv := wsServer(t, func(c *Config) { c.IP = config.LayerConfig{Points: 1, Duration: "60s"} }, http.NotFoundHandler())
	upgrade(t, srv, rfcKey, "13")

	for _, bad := range []struct{ key, version string }{
		{"", "13"},
		{"short", "13"},
		{"!!!!!!!!!!!!!!!!!!!!!!==", "13"},
		{"dGhlIHNhbXBsZSBub25jZQ==", "8"},
		{"dGhlIHNhbXBsZSBub25jZQ==x", "13"},
	} {
		resp, _, _ := upgrade(t, srv, bad.key, bad.version)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("key %q version %q: %d, want a plain 429", bad.key, bad.version, resp.StatusCode)
		}
	}
}

func TestConnectionCapPerIP(t *testing.T) {
	var mu sync.Mutex
	releases := map[string]chan struct{}{}

	// release ends the "connection" opened with key; releasing twice is harmless.
	release := func(key string) {
		mu.Lock()
		defer mu.Unlock()

		if ch, ok := releases[key]; ok {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	}

	// The "connection" lasts until the test releases it, like a proxied WebSocket.
	next := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		ch := make(chan struct{})

		mu.Lock()
		releases[req.Header.Get("Sec-WebSocket-Key")] = ch
		mu.Unlock()

		rw.WriteHeader(http.StatusSwitchingProtocols)
		rw.(http.Flusher).Flush()

		select {
		case <-ch:
		case <-time.After(time.Minute): // never block past the test run, even if its cleanup did not run
		}
	})

	srv := wsServer(t, func(c *Config) { c.Websocket.MaxConnectionsPerIP = 3 }, next)
	// Registered after wsServer, so it runs before srv.Close, which waits for the handlers.
	t.Cleanup(func() {
		mu.Lock()
		keys := make([]string, 0, len(releases))
		for k := range releases {
			keys = append(keys, k)
		}
		mu.Unlock()

		for _, k := range keys {
			release(k)
		}
	})

	p := pluginOf(srv.Config.Handler)
	keys := []string{"AAAAAAAAAAAAAAAAAAAAAA==", "AQAAAAAAAAAAAAAAAAAAAA==", "AgAAAAAAAAAAAAAAAAAAAA==", "AwAAAAAAAAAAAAAAAAAAAA=="}

	for _, k := range keys[:3] {
		if resp, _, _ := upgrade(t, srv, k, "13"); resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != "" {
			t.Fatalf("connection %s: %d %v", k, resp.StatusCode, resp.Header)
		}
	}

	if n := p.ws.open("127.0.0.1"); n != 3 {
		t.Fatalf("%d open", n)
	}

	resp, br, _ := upgrade(t, srv, keys[3], "13")
	if resp.Header.Get("Sec-WebSocket-Accept") == "" {
		t.Fatalf("4th connection not refused by the plugin: %v", resp.Header)
	}

	if code, _ := readClose(t, br); code != 1013 {
		t.Fatalf("4th: close %d", code)
	}

	// One ends: a new one is accepted.
	release(keys[0])
	waitOpen(t, p.ws, "127.0.0.1", 2)

	if resp, _, _ := upgrade(t, srv, keys[3], "13"); resp.Header.Get("Sec-WebSocket-Accept") != "" {
		t.Fatal("refused after a slot was freed")
	}

	for _, k := range keys {
		release(k)
	}

	waitOpen(t, p.ws, "127.0.0.1", 0)

	p.ws.mu.Lock()
	defer p.ws.mu.Unlock()

	if len(p.ws.byIP) != 0 || len(p.ws.logged) != 0 {
		t.Fatalf("counter maps keep %d and %d entries", len(p.ws.byIP), len(p.ws.logged))
	}
}

// waitOpen waits until ip holds want connections: a released handler returns
// on its own goroutine.
func waitOpen(t *testing.T, c *connCounter, ip string, want int) {
	t.Helper()

	deadline := time.Now().Add(5 * time.Second)

	for {
		n := c.open(ip)
		if n == want {
			return
		}

		if time.Now().After(deadline) {
			t.Fatalf("%d connections open for %s after 5s, want %d", n, ip, want)
		}

		time.Sleep(time.Millisecond)
	}
}

// open returns the number of connections held by ip.
func (c *connCounter) open(ip string) int {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.byIP[ip]
}

// keepTimers drives a keeping registry: its clock and its timers, which the
// test fires, so that no test waits for a grace or a window.
type keepTimers struct {
	now     int64
	started chan keepTimer
}

type keepTimer struct {
	d time.Duration
	f func()
}

func newKeepTimers(r *lifetime.HeldRegistry, now int64) *keepTimers {
	kt := &keepTimers{now: now, started: make(chan keepTimer, 16)}
	r.Now = func() time.Time { return time.Unix(0, kt.now) }
	r.After = func(d time.Duration, f func()) { kt.started <- keepTimer{d, f} }

	return kt
}

// next returns the next timer started; the first one after a ctx is
// cancelled is started on a goroutine of context.AfterFunc's, hence the
// wait (with a deadline).
func (kt *keepTimers) next(t *testing.T) keepTimer {
	t.Helper()

	select {
	case tm := <-kt.started:
		return tm
	case <-time.After(5 * time.Second):
		t.Fatal("no timer started")
		return keepTimer{}
	}
}

// fire moves the clock to the timer's end and runs it.
func (kt *keepTimers) fire(tm keepTimer) {
	kt.now += int64(tm.d)
	tm.f()
}

// TestUnheldConnectionCounterKeptWhileConnectionsAreOpen: a removed
// middleware's WebSocket connections stay open; their counter is kept
// (checked every grace) until they close, so the middleware configured
// again does not admit maxConnectionsPerIP more.
func TestUnheldConnectionCounterKeptWhileConnectionsAreOpen(t *testing.T) {
	r := lifetime.NewKeepingRegistry(connLive)
	kt := newKeepTimers(r, t0)

	ctx, cancel := context.WithCancel(context.Background())
	c, _ := r.Take(ctx, "rl@file", func() interface{} {
		return &connCounter{byIP: map[string]int{}, logged: map[string]bool{}, max: 5}
	}).(*connCounter)
	c.acquire("198.51.100.7")
	cancel()

	kt.fire(kt.next(t))

	tm := kt.next(t)
	if tm.d != lifetime.ReleaseGrace || r.Size() != 1 {
		t.Fatalf("with a connection open: %d entries, checked again in %s", r.Size(), tm.d)
	}

	c.release("198.51.100.7")
	kt.fire(tm)

	if r.Size() != 0 {
		t.Fatal("connection counter kept after its connections closed")
	}
}
