package tierlimit

// replacedHeaders describe the downstream's body or challenge, which a 429 replaces.
var replacedHeaders = []string{
	"Content-Length", "Content-Encoding", "Content-Range", "Content-Disposition",
	"Etag", "Last-Modified", "Www-Authenticate", "Transfer-Encoding",
}

// chargeIP charges the client's ip bucket for an invalid credential, unless
// an instance after ForwardAuth settled the charge already (chain.go), and,
// when the bucket refuses, answers 429 (or 1013) in place of the downstream.
// It reports whether it did.
func (w *watchWriter) chargeIP() bool {
	p := w.p
	h := w.rw.Header()
	now := p.now().UnixNano()

	var t tally

	c := settle(w.pending, &t, now, true)
	if c == nil {
		return false
	}

	if t.Firsts != 0 {
		report(p, c, t.Firsts)
	}

	if t.Shown < 0 {
		return false
	}

	ip := p.planInvalid[0]

	if t.Refused && !p.dryRun {
		for _, name := range replacedHeaders {
			h.Del(name)
		}

		if p.headers {
			setHeaders(h, ip, t.Left, t.Reset, t.ResetH, now)
			monthPolicyOf(h, ip, now)
		}

		reject(p, w.rw, w.req, ip, t.Reset, now)

		return true
	}

	if p.headers && (w.prevLeft < 0 || t.Left < w.prevLeft) {
		setHeaders(h, ip, t.Left, t.Reset, t.ResetH, now)
		monthPolicyOf(h, ip, now)
	}

	return false
}
