package tierlimit

import (
	"bufio"
	"errors"
	"net"
	"net/http"
)

// credentialWriter watches the status that the rest of the chain (ForwardAuth
// or the application) gives a credentialed request. A credential is not charged
// to the ip layer up front, since it may be real and arrive from a BFF that
// every user shares; when the downstream answers one of
// principal.invalidCredentialStatus, the client's ip bucket is charged, and once
// that bucket is exhausted the client gets the 429 instead of the downstream's
// answer, unless an instance after ForwardAuth has settled the request's tier
// bucket already (chain.go). So a garbage token cannot dodge the per-IP limit.
//
// Compiled code sees this wrapper through an adapter that has Hijack but no
// Flush (doc.go: wrappers), so Traefik's proxy cannot flush through it. The
// wrapper flushes the original writer itself after every write of a response
// without a Content-Length (event streams, gRPC, chunked bodies), which keeps
// streaming live, and passes Hijack through for WebSocket upgrades.
type credentialWriter struct {
	rw       http.ResponseWriter
	req      *http.Request
	p        *Plugin
	prevLeft int64 // requests left in the layer the headers show; -1 if none
	pending  *pendingIP

	wroteHeader bool
	discard     bool // the downstream's answer was replaced by a 429
	flushEach   bool
}

// replacedHeaders describe the downstream's body or challenge, which a 429 replaces.
var replacedHeaders = []string{
	"Content-Length", "Content-Encoding", "Content-Range", "Content-Disposition",
	"Etag", "Last-Modified", "Www-Authenticate", "Transfer-Encoding",
}

func (w *credentialWriter) Header() http.Header {
	return w.rw.Header()
}

func (w *credentialWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}

	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational responses precede the final one.
		w.rw.WriteHeader(code)
		return
	}

	w.wroteHeader = true

	if w.p.invalidCode[code] && w.chargeIP() {
		w.discard = true
		return
	}

	w.flushEach = w.rw.Header().Get("Content-Length") == ""
	w.rw.WriteHeader(code)

	if w.flushEach {
		w.Flush()
	}
}

func (w *credentialWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}

	if w.discard {
		return len(b), nil
	}

	n, err := w.rw.Write(b)
	if w.flushEach {
		w.Flush()
	}

	return n, err
}

// Flush flushes the original writer, for interpreted callers and for Write.
func (w *credentialWriter) Flush() {
	if f, ok := w.rw.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands over the original connection, for WebSocket upgrades.
func (w *credentialWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.rw.(http.Hijacker)
	if !ok {
		return nil, nil, errHijackUnsupported
	}

	return h.Hijack()
}

var errHijackUnsupported = errors.New("hijacking the connection: the response writer does not support it")

// chargeIP charges the client's ip bucket for an invalid credential, unless
// an instance after ForwardAuth settled the charge already (chain.go), and,
// when the bucket refuses, answers 429 (or 1013) in place of the downstream.
// It reports whether it did.
func (w *credentialWriter) chargeIP() bool {
	p := w.p
	h := w.rw.Header()
	now := p.now().UnixNano()

	var t tally

	if !settle(w.pending, &t, now, true) {
		return false
	}

	client := pendingClient(w.pending)

	if t.firsts != 0 {
		report(p, p.planInvalid, t.firsts, client, "", nil)
	}

	if t.shown < 0 {
		return false
	}

	ip := p.planInvalid[0]

	if t.refused && !p.dryRun {
		for _, name := range replacedHeaders {
			h.Del(name)
		}

		if p.headers {
			setHeaders(h, ip, t.left, t.reset, t.resetH, now)
			monthPolicyOf(h, ip, now)
		}

		reject(p, w.rw, w.req, ip, t.count, t.reset, now)

		return true
	}

	if p.headers && (w.prevLeft < 0 || t.left < w.prevLeft) {
		setHeaders(h, ip, t.left, t.reset, t.resetH, now)
		monthPolicyOf(h, ip, now)
	}

	return false
}
