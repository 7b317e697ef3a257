package memstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
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
// first when the store is full. The Redis script (../redisstore/scripts.go) computes the
// same in exact integer microseconds with Redis's clock.

// drip takes cost tokens from the token-bucket layer l under s.mu and
// records it in t as layers[i]. It reports whether the layer refused, which
// takes nothing, in dry run too (rate.Limiter.Allow does the same).
func (s *WindowStore) drip(t *tally, i int, now int64, l *layer, key string, cost int64) bool {
	w := l.Entries[key]
	if w == nil {
		s.makeRoom(now, l.List)

		w = &window{Layer: l.Name, Key: key, Reset: now}
		l.Entries[key] = w
		s.size++
	} else {
		if w.List != l.List {
			// A window of another algorithm, left by a reload: a full bucket.
			w.Reset = now
			w.Logged = false
		}

		if w.List != nil {
			w.List.Unlink(w)
		}
	}

	w.Start = now
	w.Taken = s.Takes
	l.List.Push(w)

	tat := w.Reset
	if tat < now {
		tat = now
	}

	if tat-now > (l.Points-cost)*l.Interval {
		l.Stats.Refused++
		w.Refused++

		first := !w.Logged
		w.Logged = true
		retry := tat - (l.Points-cost)*l.Interval
		return rule.RefuseAs(t, i, l, l.Points+1, retry, []string{strconv.FormatInt(limit.CeilSeconds(retry), 10)}, first)
	}

	tat += cost * l.Interval
	w.Reset = tat
	w.Expire = tat
	w.Logged = false

	// X-RateLimit-Reset changes with every request; it is formatted again
	// only when its second does.
	secs := limit.CeilSeconds(tat)
	if w.ResetH == nil || w.ResetSec != secs {
		w.ResetSec = secs
		w.ResetH = []string{strconv.FormatInt(secs, 10)}
	}

	used := BucketUsed(tat-now, l.Interval)
	w.Count = used
	l.Stats.Allowed++
	rule.Allow(t, i, l, used, tat, w.ResetH)

	return false
}

// bucketUsed is the number of tokens missing from a bucket whose TAT is ahead
// of now by ahead: ceil(ahead / interval).
func BucketUsed(ahead, interval int64) int64 {
	if ahead <= 0 {
		return 0
	}

	return (ahead + interval - 1) / interval
}

// maxHostKeyLen bounds the hosts kept as keys; a longer one is keyed by its
// digest, as long principal ids are.
const MaxHostKeyLen = 128
