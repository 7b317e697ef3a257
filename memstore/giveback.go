package memstore

import (
	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// GiveBack returns cost points to each of c's first n layers, which the
// current request charged before a later layer refused it, under the
// store's lock: a refused request changes no layer's count (README: Layers).
// Within one hold of the lock the counters are those the request charged, so
// the counts are exact and no other request sees the charge. Each layer's
// allowed count keeps its own decision: it let the request by. skip has bit
// i set for a layer that took nothing (tally.uncharged).
func GiveBack(c *rule.Charge, n int, cost int64, skip uint64) {
	for i := 0; i < n; i++ {
		if skip&(uint64(1)<<uint(i)) != 0 {
			continue
		}

		// A check-only layer was evaluated, not charged.
		l := c.Layers[i]
		w := l.Entries[c.Keys[i]]
		if w == nil || l.CheckOnly {
			continue
		}

		if l.Alg == algConcurrency {
			releaseSlot(w, c.Now+l.Duration)
			continue
		}

		unspend(w, l, cost)
	}
}

// unspend takes cost points off a counter: a window's count, or a token
// bucket's TAT by cost emission intervals (a bucket whose TAT falls behind
// the present is as full as one at the present).
func unspend(w *counter.Entry, l *rule.Layer, cost int64) {
	if l.Alg == algTokenBucket {
		w.Reset = limit.BucketReturn(w.Reset, cost, l.Interval)
		w.Expire = w.Reset
		w.Count -= cost

		if w.Count < 0 {
			w.Count = 0
		}

		return
	}

	w.Count -= cost
	if w.Count < 0 {
		w.Count = 0
	}
}

// Refund gives back cost points to layers that an earlier decision charged,
// for a request that a later, deferred charge refused (../after.go): the edge
// charges global up front for a credentialed request, and the client's ip
// bucket only once the chain has told a real credential from a garbage one.
// A window that has ended since is left alone: the charge went with it. A
// concurrency layer gives back the slot of a request admitted at c.Now (a
// Redis refusal after the memory layers of redisstore.TakeMixed, a costFrom route's
// refusal after the other layers, the mirror of Redis's slot); a deferred
// refund leaves concurrency layers out (rule.ChargedOnly), the
// request's release frees their slot.
func Refund(s *WindowStore, c *rule.Charge, cost int64) {
	s.Mu.Lock()

	for i, l := range c.Layers {
		if w := l.Entries[c.Keys[i]]; w != nil && l.Alg == algConcurrency && w.List == l.List {
			releaseSlot(w, c.Now+l.Duration)
		} else if w != nil && !l.CheckOnly && w.List == l.List && (l.Alg == algTokenBucket || w.Reset > c.Now) {
			unspend(w, l, cost)
		}
	}

	s.Mu.Unlock()
}

// ExceptUncharged is layers without those a take left uncharged (a dry-run
// sliding window or token bucket that would refuse: tally.uncharged), which
// a refund must not give points back to.
func ExceptUncharged(layers []*rule.Layer, uncharged uint64) []*rule.Layer {
	if uncharged == 0 {
		return layers
	}

	var out []*rule.Layer

	for i, l := range layers {
		if uncharged&(uint64(1)<<uint(i)) == 0 {
			out = append(out, l)
		}
	}

	return out
}

// UnspendFast gives back the cost a root's fast path (serveRoutedFast,
// serveCountedFast, mixedPath) charged to the first n layers, and their
// allowed counts, under the memory store's lock, for a request the general
// path then decides anew. A check-only layer was evaluated, not charged; a window
// that ended meanwhile is left alone: the points went with it.
func UnspendFast(layers []*rule.Layer, n int, client string, cost, now int64) {
	for _, l := range layers[:n] {
		if l.CheckOnly {
			continue // evaluated, not charged
		}

		key := client
		if l.KeyKind == keyOfConst {
			key = l.ConstKey
		}

		if w := l.Entries[key]; w != nil && w.List == l.List && w.Reset > now {
			w.Count -= cost
			if w.Count < 0 {
				w.Count = 0
			}
		}

		l.Stats.Allowed--
	}
}
