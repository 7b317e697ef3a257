package harness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Backend is the test and demo backend. It answers 200 with the method, path,
// principal and X-Forwarded-For it received; 404 under /missing; a WebSocket
// echo on /ws; and a two-event stream on /sse (see ServeHTTP).
type Backend struct {
	mu       sync.Mutex
	releases map[string]chan struct{}
}

// NewBackend returns a Backend.
func NewBackend() *Backend {
	return &Backend{releases: map[string]chan struct{}{}}
}

// SSEWait bounds how long /sse waits for its release before it sends "late".
const SSEWait = 15 * time.Second

func (b *Backend) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	switch {
	case strings.HasPrefix(req.URL.Path, "/missing"):
		http.NotFound(rw, req)
	case req.URL.Path == "/ws":
		b.echo(rw, req)
	case req.URL.Path == "/sse":
		b.events(rw, req)
	case req.URL.Path == "/sse-release":
		b.release(req.URL.Query().Get("id"))
	default:
		rw.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(rw, "ok %s %s\nX-Auth-User: %s\nX-Forwarded-For: %s\n",
			req.Method, req.URL.Path, req.Header.Get("X-Auth-User"), req.Header.Get("X-Forwarded-For"))
	}
}

// events sends "event: one", then waits until /sse-release?id=<id> is called
// (by a client that has read event one) and sends "event: two". If event one
// is held back until the stream ends, nobody releases it and, after SSEWait,
// the second event is "late".
func (b *Backend) events(rw http.ResponseWriter, req *http.Request) {
	id := req.URL.Query().Get("id")
	ch := b.channel(id)

	rw.Header().Set("Content-Type", "text/event-stream")
	rw.Header().Set("Cache-Control", "no-cache")
	rw.WriteHeader(http.StatusOK)
	fmt.Fprint(rw, "event: one\ndata: 1\n\n")
	http.NewResponseController(rw).Flush()

	second := "two"
	select {
	case <-ch:
	case <-time.After(SSEWait):
		second = "late"
	case <-req.Context().Done():
		return
	}

	fmt.Fprintf(rw, "event: %s\ndata: 2\n\n", second)
}

func (b *Backend) channel(id string) chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()

	ch := b.releases[id]
	if ch == nil {
		ch = make(chan struct{})
		b.releases[id] = ch
	}

	return ch
}

func (b *Backend) release(id string) {
	ch := b.channel(id)

	b.mu.Lock()
	defer b.mu.Unlock()

	select {
	case <-ch:
	default:
		close(ch)
	}
}

// echo is a WebSocket echo server.
func (b *Backend) echo(rw http.ResponseWriter, req *http.Request) {
	c, err := websocket.Accept(rw, req, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()

	ctx, cancel := context.WithTimeout(req.Context(), time.Minute)
	defer cancel()

	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return
		}

		if err := c.Write(ctx, typ, msg); err != nil {
			return
		}
	}
}

// Serve serves h on addr ("127.0.0.1:0" for any port) and returns its base URL
// and a function that stops it.
func Serve(addr string, h http.Handler) (string, func(), error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listening on %s: %w", addr, err)
	}

	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()

	return "http://" + l.Addr().String(), func() { _ = srv.Close() }, nil
}

// ServeBackend serves a new Backend on addr.
func ServeBackend(addr string) (string, func(), error) {
	return Serve(addr, NewBackend())
}
