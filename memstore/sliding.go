package memstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// A sliding layer uses the sliding-window counter (../limit/sliding.go):
// windows follow each other from a key's first hit, and the previous
// window's count weighs on the current one by how much of it still overlaps
// the last duration. This removes the fixed window's burst of twice the
// points across a boundary, for one more counter per key. Unlike a fixed
// window, a sliding layer counts only the requests it allows: a client that
// keeps retrying above the limit would otherwise carry its refusals into
// every following window and never be let through again. A request is
// charged in slide (take_gen.go, from ../paths.tmpl, where limit.Over is
// written out).

// slidingAt is key's sliding window in l at now: started when missing,
// expired or of another algorithm, moved on when its window ended, held by
// the current request (WindowStore.Takes). Called with s.mu held.
func slidingAt(s *WindowStore, l *rule.Layer, key string, now int64) *counter.Entry {
	w := l.Entries[key]
	if w == nil || w.Expire <= now || w.List != l.List {
		w = s.Restart(now, l, w, key)
	}

	w.Taken = s.Takes

	if w.Reset <= now {
		rotate(w, l, now)
	}

	return w
}

// rotate moves a sliding window whose window ended less than a duration
// before now (else it expired) to the next window, which starts where it
// ended (limit.SlidingAt).
func rotate(w *counter.Entry, l *rule.Layer, now int64) {
	w.List.Unlink(w)
	w.PrevCount, w.Count, w.Reset = limit.SlidingAt(w.PrevCount, w.Count, w.Reset, now, l.Duration)
	w.Refused = 0
	w.Logged = false
	w.Start = w.Reset - l.Duration
	w.Expire = w.Start + l.List.Span
	w.ResetSec = limit.CeilSeconds(w.Reset)
	w.ResetH = []string{strconv.FormatInt(w.ResetSec, 10)}
	l.List.Push(w)
}
