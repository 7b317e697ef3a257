package usage

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"
)

// A compressed body (Content-Encoding gzip or deflate) is decoded as it
// comes, into the Reader of the decoded body (Reader.inner), which reads it
// as any body: bounded by the DECODED size (MaxJSONBody, MaxEventBytes),
// so a small body that decodes to a huge one (a gzip bomb) states no cost
// and costs the memory of the bounds only. The standard library's decoders
// read from an io.Reader and cannot stop and resume where a chunk ends, so
// each compressed body has a goroutine of its own that decodes it, fed one
// chunk at a time: Feed hands it a chunk and waits until it has decoded all
// it could and asks for more, so that what a chunk states is read before
// the client has the chunk (the root's holdStated), and the Reader is
// never read by both at once. Result ends it. A JSON body's goroutine ends
// as soon as the decoded body passes its bound.

// The codings a Reader decodes (readableCoding).
const (
	codingIdentity = iota
	codingNone     // one it cannot read
	codingGzip
	codingDeflate
)

// decodeBuffer is what the decoder hands the inner Reader at a time.
const decodeBuffer = 32 << 10

// readableCoding is the coding of a body whose Content-Encoding values are
// v: identity for none, none for a coding it cannot decode or several
// codings.
func readableCoding(v []string) int {
	if len(v) == 0 {
		return codingIdentity
	}

	if len(v) > 1 {
		return codingNone
	}

	switch strings.ToLower(strings.TrimSpace(v[0])) {
	case "", "identity":
		return codingIdentity
	case "gzip", "x-gzip":
		return codingGzip
	case "deflate":
		return codingDeflate
	}

	return codingNone
}

// inflater is the goroutine that decodes a compressed body, and the
// io.Reader of the compressed bytes that its decoder reads.
type inflater struct {
	coding int

	in   chan []byte // the chunks, to the goroutine; closed when the body ends
	need chan bool   // the goroutine asks for a chunk; closed when it ends
	cur  []byte      // what remains of the chunk being read
	eof  bool        // in was closed
	dead bool        // the goroutine has ended (Feed's and Result's side)
}

// Read hands the decoder the compressed bytes: those of the current chunk,
// else it asks for the next one and waits.
func (z *inflater) Read(p []byte) (int, error) {
	if len(z.cur) == 0 {
		if z.eof {
			return 0, io.EOF
		}

		z.need <- true

		b, ok := <-z.in
		if !ok {
			z.eof = true
			return 0, io.EOF
		}

		z.cur = b
	}

	n := copy(p, z.cur)
	z.cur = z.cur[n:]

	return n, nil
}

// feedCompressed is Feed for a compressed body: the goroutine starts with
// the first chunk.
func feedCompressed(r *Reader, b []byte) {
	z := r.z
	if z.dead || len(b) == 0 {
		return
	}

	if z.in == nil {
		z.in = make(chan []byte)
		z.need = make(chan bool)

		inner, _ := r.inner.(*Reader)
		go inflate(z, r, inner)

		if _, ok := <-z.need; !ok {
			z.dead = true
			return
		}
	}

	z.in <- b

	if _, ok := <-z.need; !ok {
		z.dead = true
	}
}

// endInflate ends r's decoding, once the body has ended: the goroutine
// decodes what remains and ends.
func endInflate(r *Reader) {
	z := r.z
	if z.in == nil || z.dead {
		return
	}

	close(z.in)

	for {
		if _, ok := <-z.need; !ok {
			break
		}
	}

	z.dead = true
}

// inflate is the goroutine that decodes z's body into inner, the Reader of
// outer's decoded body. A panic ends it without a cost (it would kill
// Traefik).
func inflate(z *inflater, outer, inner *Reader) {
	defer func() {
		_ = recover()
		close(z.need)
	}()

	var src io.Reader = z

	dec, err := decoder(z.coding, src)
	if err != nil {
		return
	}

	buf := make([]byte, decodeBuffer)

	for {
		n, err := dec.Read(buf)
		if n > 0 {
			Feed(inner, buf[:n])

			cost, ok := Stated(inner)
			outer.cost = cost
			outer.ok = ok

			if !inner.stream && inner.over {
				return
			}
		}

		if err != nil {
			return
		}
	}
}

// decoder reads the coding of src: gzip, or deflate, which HTTP means as
// zlib (RFC 9110) and some servers send raw: a body that does not start
// with a zlib header is read raw.
func decoder(coding int, src io.Reader) (io.Reader, error) {
	if coding == codingGzip {
		return gzip.NewReader(src)
	}

	br := bufio.NewReader(src)

	head, err := br.Peek(2)
	if err != nil {
		return nil, err
	}

	if head[0]&0x0f == 8 && (uint(head[0])<<8|uint(head[1]))%31 == 0 {
		return zlib.NewReader(br)
	}

	return flate.NewReader(br), nil
}

// NarrowAcceptEncoding keeps, of the codings a request's Accept-Encoding
// (h's) lists, those a Reader decodes (gzip, x-gzip, deflate, identity),
// each with its parameters: a response in another coding (br, zstd) would
// state no cost. A list left empty becomes "identity"; a request without
// the header is left without it. A list that holds only those codings is
// left as it is.
func NarrowAcceptEncoding(h http.Header) {
	// A frame this small on every costFrom request (doc.go in the root:
	// frames); narrowCodings when there is a list.
	if v := h["Accept-Encoding"]; v != nil {
		narrowCodings(h, v)
	}
}

// narrowCodings is NarrowAcceptEncoding for the values v.
func narrowCodings(h http.Header, v []string) {
	if len(v) == 1 && readableList(v[0]) {
		return
	}

	var kept []string

	for _, line := range v {
		for _, member := range strings.Split(line, ",") {
			if m := strings.TrimSpace(member); m != "" && readableMember(m) {
				kept = append(kept, m)
			}
		}
	}

	if kept == nil {
		h["Accept-Encoding"] = []string{"identity"}
		return
	}

	h["Accept-Encoding"] = []string{strings.Join(kept, ", ")}
}

// readableList reports whether every member of the list s names a coding
// a Reader decodes.
func readableList(s string) bool {
	for _, member := range strings.Split(s, ",") {
		if !readableMember(strings.TrimSpace(member)) {
			return false
		}
	}

	return true
}

// readableMember reports whether a member of Accept-Encoding (parameters
// aside) names a coding a Reader decodes.
func readableMember(m string) bool {
	if i := strings.IndexByte(m, ';'); i >= 0 {
		m = strings.TrimSpace(m[:i])
	}

	switch strings.ToLower(m) {
	case "gzip", "x-gzip", "deflate", "identity":
		return true
	}

	return false
}
