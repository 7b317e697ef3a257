package memstore

import (
	"github.com/tierlimit/tierlimit/counter"
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
// first when the store is full. A request takes its tokens in drip
// (take_gen.go, from ../paths.tmpl, where limit.Over is written out).

// bucketAt is key's token bucket in l, made full when missing (or when a
// reload left a window of another algorithm), and moved to the end of its
// list as the last used. Called with s.mu held.
func bucketAt(s *WindowStore, l *rule.Layer, key string, now int64) *counter.Entry {
	w := l.Entries[key]
	if w == nil {
		s.makeRoom(now, l.List)

		w = &counter.Entry{Layer: l.Name, Key: key, Reset: now}
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
