package tierlimit

import (
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"strings"
	"sync"
	"time"
)

// A refused WebSocket upgrade is answered with a completed handshake and a
// close frame of status 1013 (Try Again Later): browsers hide the HTTP status of
// a failed upgrade (the page only sees 1006), so a 429 would be invisible.

// closeTryAgainLater is RFC 6455's status 1013.
const closeTryAgainLater = 1013

// wsGUID is the RFC 6455 constant appended to Sec-WebSocket-Key.
const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// isUpgrade reports whether req asks for a WebSocket upgrade.
func isUpgrade(req *http.Request) bool {
	if !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		return false
	}

	for _, v := range req.Header["Connection"] {
		for _, token := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(token), "upgrade") {
				return true
			}
		}
	}

	return false
}

// acceptKey returns Sec-WebSocket-Accept for a valid Sec-WebSocket-Key (the
// base64 of 16 bytes), or "" when the key or the version is not RFC 6455's.
func acceptKey(req *http.Request) string {
	if req.Method != http.MethodGet || req.Header.Get("Sec-WebSocket-Version") != "13" {
		return ""
	}

	key := strings.TrimSpace(req.Header.Get("Sec-WebSocket-Key"))
	if len(key) != 24 {
		return ""
	}

	if raw, err := base64.StdEncoding.DecodeString(key); err != nil || len(raw) != 16 {
		return ""
	}

	sum := sha1.Sum([]byte(key + wsGUID))

	return base64.StdEncoding.EncodeToString(sum[:])
}

// refuseUpgrade completes the handshake on the hijacked connection and closes
// it with 1013 and reason. The handshake carries the rate-limit headers already
// set on rw. A malformed upgrade, or a writer that cannot be hijacked (HTTP/2),
// gets the plain refusal instead; plain writes it.
func refuseUpgrade(rw http.ResponseWriter, req *http.Request, reason string, plain func()) {
	accept := acceptKey(req)
	hj, ok := rw.(http.Hijacker)

	if accept == "" || !ok {
		plain()
		return
	}

	conn, brw, err := hj.Hijack()
	if err != nil {
		plain()
		return
	}
	defer conn.Close()

	var b strings.Builder

	b.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ")
	b.WriteString(accept)
	b.WriteString("\r\n")

	for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After"} {
		if v := rw.Header().Get(name); v != "" {
			b.WriteString(name + ": " + v + "\r\n")
		}
	}

	b.WriteString("\r\n")

	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = brw.WriteString(b.String())
	_, _ = brw.Write(closeFrame(closeTryAgainLater, reason))
	_ = brw.Flush()
}

// closeFrame is an unmasked (server) close frame; the reason is cut to fit a
// control frame's 125-byte payload.
func closeFrame(code uint16, reason string) []byte {
	if len(reason) > 123 {
		reason = reason[:123]
	}

	frame := make([]byte, 4, 4+len(reason))
	frame[0] = 0x88 // FIN + opcode close
	frame[1] = byte(2 + len(reason))
	binary.BigEndian.PutUint16(frame[2:], code)

	return append(frame, reason...)
}

// connCounter counts the open upgraded connections per client IP in this
// process and caps them. An upgrade holds its slot while the rest of the chain
// serves it, which for a WebSocket is the connection's whole life: Traefik's
// proxy returns when either side closes or the network drops.
type connCounter struct {
	mu     sync.Mutex
	max    int
	byIP   map[string]int
	logged map[string]bool // a refusal was reported since the IP last had a free slot
}

// acquire takes a slot for ip. It reports whether it did, and whether this is
// the first refusal to report.
func (c *connCounter) acquire(ip string) (ok, first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.byIP[ip] >= c.max {
		first = !c.logged[ip]
		c.logged[ip] = true

		return false, first
	}

	c.byIP[ip]++

	return true, false
}

func (c *connCounter) release(ip string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.byIP[ip]--
	if c.byIP[ip] <= 0 {
		delete(c.byIP, ip)
	}

	delete(c.logged, ip)
}

// connCounters holds one connCounter per middleware name while some instance
// of the middleware uses it or it counts open connections (lifetime.go,
// keep.go), like the memory store.
var connCounters = &counterRegistry{byName: newKeepingRegistry(connLive)}

type counterRegistry struct {
	byName *heldRegistry // *connCounter by middleware name
}

// get returns the counter of the middleware called name, held until ctx is
// cancelled, with the cap capacity.
func (r *counterRegistry) get(ctx context.Context, name string, capacity int) *connCounter {
	v := r.byName.take(ctx, name, func() interface{} {
		return &connCounter{byIP: map[string]int{}, logged: map[string]bool{}}
	})

	c, _ := v.(*connCounter)

	c.mu.Lock()
	c.max = capacity
	c.mu.Unlock()

	return c
}
