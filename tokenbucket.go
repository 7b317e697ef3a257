package tierlimit

import (
	"net"
	"strings"

	"github.com/tierlimit/tierlimit/limit"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/request"
)

// A tokenbucket layer is the token bucket of golang.org/x/time/rate, which
// Traefik's rateLimit middleware uses: a bucket of burst tokens, full at a
// key's first request, refilled at points per duration, one token per request.
// It is computed as the generic cell rate algorithm: with the emission interval
// T = duration / points, a key's whole state is its theoretical arrival time
// TAT, the moment its bucket is full again. A request at now is allowed iff
//
//	max(TAT, now) - now <= (burst - 1) x T
//
// and then TAT = max(TAT, now) + T. A refused request takes no token, as with
// rate.Limiter.Allow. The tokens left after a request are burst - ceil((TAT -
// now) / T); after a refusal, the next token is back at TAT - (burst - 1) x T.
//
// In the memory store a bucket is a window whose reset and expire are its TAT
// (a full bucket needs no state) and whose start is its last request, so that
// its list, ordered by last request, gives the least recently used bucket
// first when the store is full. The Redis script (redisstore.go) computes the
// same in exact integer microseconds with Redis's clock.

// makeBucket turns l into a token bucket for spec: points becomes the burst,
// the bucket's capacity, which the headers and the refusal report as the limit.
// It returns spec with its points set to the burst likewise.
func (l *layer) makeBucket(spec config.Rule) config.Rule {
	l.refill = spec.Points
	l.interval = int64(spec.Duration) / spec.Points
	l.points = spec.Burst
	l.limit = formatInt(spec.Burst)
	spec.Points = spec.Burst

	return spec
}

// drip takes cost tokens from the token-bucket layer l under s.mu and
// records it in t as layers[i]. It reports whether the layer refused, which
// takes nothing, in dry run too (rate.Limiter.Allow does the same).
func (s *windowStore) drip(t *tally, i int, now int64, l *layer, key string, cost int64) bool {
	w := l.entries[key]
	if w == nil {
		s.makeRoom(now, l.list)

		w = &window{layer: l.name, key: key, reset: now}
		l.entries[key] = w
		s.size++
	} else {
		if w.list != l.list {
			// A window of another algorithm, left by a reload: a full bucket.
			w.reset = now
			w.logged = false
		}

		if w.list != nil {
			w.list.unlink(w)
		}
	}

	w.start = now
	w.taken = s.takes
	l.list.push(w)

	tat := w.reset
	if tat < now {
		tat = now
	}

	if tat-now > (l.points-cost)*l.interval {
		l.stats.refused++
		w.refused++

		first := !w.logged
		w.logged = true
		retry := tat - (l.points-cost)*l.interval
		return t.refuseAs(i, l, l.points+1, retry, []string{formatInt(limit.CeilSeconds(retry))}, first)
	}

	tat += cost * l.interval
	w.reset = tat
	w.expire = tat
	w.logged = false

	// X-RateLimit-Reset changes with every request; it is formatted again
	// only when its second does.
	secs := limit.CeilSeconds(tat)
	if w.resetH == nil || w.resetSec != secs {
		w.resetSec = secs
		w.resetH = []string{formatInt(secs)}
	}

	used := bucketUsed(tat-now, l.interval)
	w.count = used
	l.stats.allowed++
	t.allow(i, l, used, tat, w.resetH)

	return false
}

// bucketUsed is the number of tokens missing from a bucket whose TAT is ahead
// of now by ahead: ceil(ahead / interval).
func bucketUsed(ahead, interval int64) int64 {
	if ahead <= 0 {
		return 0
	}

	return (ahead + interval - 1) / interval
}

// appendBucket is liveKeys' loop for a token-bucket layer, under the store's
// lock: the live buckets (not full) with the tokens missing from each as
// their count, limited when the next request would be refused.
func appendBucket(out []liveKey, i int, l *layer, m map[string]*window, f *liveFilter) []liveKey {
	now, limitedOnly, prefix := f.now, f.limitedOnly, f.prefix
	for key, w := range m {
		if w.reset <= now || w.list != l.list || (prefix != "" && !strings.HasPrefix(key, prefix)) {
			continue
		}

		limited := w.reset-now > (l.points-1)*l.interval
		if limited || !limitedOnly {
			out = append(out, liveKey{layer: i, key: key, count: bucketUsed(w.reset-now, l.interval), reset: w.reset, limited: limited, refused: w.refused})
		}
	}

	return out
}

// maxHostKeyLen bounds the hosts kept as keys; a longer one is keyed by its
// digest, as long principal ids are.
const maxHostKeyLen = 128

// hostKey is the bucket key of a layer keyed by host: the request's host,
// without its port, in lower case, or client when the request has none.
func hostKey(host, client string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}

	host = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(host), "."))
	if host == "" {
		return client
	}

	if len(host) > maxHostKeyLen {
		return request.HashKey(host)
	}

	return "host:" + host
}
