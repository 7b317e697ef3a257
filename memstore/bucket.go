package memstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// A tokenbucket layer is the token bucket of golang.org/x/time/rate, which
// Traefik's rateLimit middleware uses, computed as the generic cell rate
// algorithm (../limit/bucket.go): a key's whole state is its theoretical
// arrival time TAT, the moment its bucket is full again. A refused request
// takes no token, as with rate.Limiter.Allow.
//
// In the memory store a bucket is a window whose reset and expire are its TAT
// (a full bucket needs no state) and whose start is its last request, so that
// its list, ordered by last request, gives the least recently used bucket
// first when the store is full.

// drip takes cost tokens from the token-bucket layer l under s.mu and
// records it in t as layers[i]. It reports whether the layer refused, which
// takes nothing, in dry run too (rate.Limiter.Allow does the same).
func drip(s *WindowStore, t *tally, i int, now int64, l *layer, key string, cost int64) bool {
	w := bucketAt(s, l, key, now)

	tat, used := limit.BucketTake(w.Reset, now, cost, l.Points, l.Interval)
	if used > l.Points {
		l.Stats.Refused++
		w.Refused++

		first := !w.Logged
		w.Logged = true
		return rule.RefuseAs(t, i, l, used, tat, []string{strconv.FormatInt(limit.CeilSeconds(tat), 10)}, first)
	}

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

	w.Count = used
	l.Stats.Allowed++
	rule.Allow(t, i, l, used, tat, w.ResetH)

	return false
}

// MaxHostKeyLen bounds the hosts kept as keys; a longer one is keyed by its
// digest, as long principal ids are.
const MaxHostKeyLen = 128

// bucketAt is key's token bucket in l, made full when missing (or when a
// reload left a window of another algorithm), and moved to the end of its
// list as the last used. Called with s.mu held.
func bucketAt(s *WindowStore, l *layer, key string, now int64) *window {
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

	return w
}
