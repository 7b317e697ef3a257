package tierlimit

import (
	"bufio"
	"errors"
	"net"
	"net/http"
)

// watchWriter watches the status that the rest of the chain (ForwardAuth or
// the application) gives a request whose charge depends on it, and decides
// that charge before the status goes out, so that the headers can show it:
//   - pending: a credentialed request's ip charge (invalidcred.go). A
//     credential is not charged to the ip layer up front, since it may be
//     real and arrive from a BFF that every user shares; when the downstream
//     answers one of principal.invalidCredentialStatus, the client's ip
//     bucket is charged, and once that bucket is exhausted the client gets
//     the 429 instead of the downstream's answer, unless an instance after
//     ForwardAuth has settled the request's tier bucket already (chain.go).
//     So a garbage token cannot dodge the per-IP limit.
//   - routes: the countStatus routes the request matched (countstatus.go),
//     charged when their list holds the status. A WebSocket upgrade is
//     watched too, as its answer may be a listed 401; its 101, written on the
//     hijacked connection, counts only where 101 is listed.
//
// Compiled code sees this wrapper through an adapter that has Hijack but no
// Flush (doc.go: wrappers), so Traefik's proxy cannot flush through it. The
// wrapper flushes the original writer itself after every write of a response
// without a Content-Length (event streams, gRPC, chunked bodies), which keeps
// streaming live, and passes Hijack through for WebSocket upgrades.
type watchWriter struct {
	rw       http.ResponseWriter
	req      *http.Request
	p        *Plugin
	prevLeft int64 // requests left in the layer the headers show; -1 if none

	pending *pendingIP // a credentialed request's ip charge; nil: none

	routes            []*route // countStatus routes matched; nil: none
	client, principal string   // the routes' keys
	cost              int64    // the request's cost, which a listed status charges

	wroteHeader bool
	discard     bool // the downstream's answer was replaced by a 429
	flushEach   bool
}

func (w *watchWriter) Header() http.Header {
	return w.rw.Header()
}

func (w *watchWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}

	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational responses precede the final one.
		w.rw.WriteHeader(code)
		return
	}

	w.wroteHeader = true

	if w.routes != nil {
		w.count(code)
	}

	if w.pending != nil && w.p.invalidCode[code] && w.chargeIP() {
		w.discard = true
		return
	}

	w.flushEach = w.rw.Header().Get("Content-Length") == ""
	w.rw.WriteHeader(code)

	if w.flushEach {
		w.Flush()
	}
}

func (w *watchWriter) Write(b []byte) (int, error) {
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
func (w *watchWriter) Flush() {
	if f, ok := w.rw.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands over the original connection, for WebSocket upgrades: the
// response is then the 101 the proxy writes on it.
func (w *watchWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.rw.(http.Hijacker)
	if !ok {
		return nil, nil, errHijackUnsupported
	}

	if !w.wroteHeader && w.routes != nil {
		w.wroteHeader = true
		w.count(http.StatusSwitchingProtocols)
	}

	return h.Hijack()
}

var errHijackUnsupported = errors.New("hijacking the connection: the response writer does not support it")
