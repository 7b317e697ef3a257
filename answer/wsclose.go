package answer

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"strings"
	"time"
)

// A refused WebSocket upgrade is answered with a completed handshake and a
// close frame of status 1013 (Try Again Later): browsers hide the HTTP status of
// a failed upgrade (the page only sees 1006), so a 429 would be invisible.

// closeTryAgainLater is RFC 6455's status 1013.
const closeTryAgainLater = 1013

// wsGUID is the RFC 6455 constant appended to Sec-WebSocket-Key.
const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

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

// RefuseUpgrade completes the handshake on the hijacked connection and closes
// it with 1013 and reason. The handshake carries the rate-limit headers already
// set on rw. A malformed upgrade, or a writer that cannot be hijacked (HTTP/2),
// gets the plain refusal instead; plain writes it.
func RefuseUpgrade(rw http.ResponseWriter, req *http.Request, reason string, plain func()) {
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
