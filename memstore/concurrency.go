package memstore

import (
	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/rule"
)

// A concurrency layer counts requests in flight: a key's window holds its
// slots (window.Slots), each one's lease end, the admission time plus the
// layer's duration. A request is admitted while fewer than points slots are
// held once the ended ones are dropped, and holds one slot whatever its cost;
// its release after the response (Release) removes the slot of its lease end,
// and a slot whose request never ends (a hung request; in Redis, a replica
// that died) frees itself when its lease does. The window's count is the
// slots held, its reset the latest lease end, after which it expires. A
// request takes its slot in hold (take_gen.go, from ../paths.tmpl, where
// limit.Full is written out).

// RetryConcurrency is when a client refused by a concurrency layer should
// try again, in nanoseconds: Retry-After: 1.
const RetryConcurrency = 1000000000

// dropEnded is slots without those whose lease ended by now.
func dropEnded(slots []int64, now int64) []int64 {
	kept := slots[:0]
	for _, end := range slots {
		if end > now {
			kept = append(kept, end)
		}
	}

	return kept
}

// releaseSlot frees the slot of lease end in w, if it is still held (a slot
// whose lease ended may be gone already). Called with the store's lock held.
// A slot is named by its lease end, so of two requests of one key admitted
// in the same nanosecond, the first to end frees either's slot: the count
// stays right, only which lease runs on may differ (after a reset of the
// key in between, the one reset away would free the other's).
func releaseSlot(w *counter.Entry, end int64) {
	for j, e := range w.Slots {
		if e == end {
			w.Slots = append(w.Slots[:j], w.Slots[j+1:]...)
			w.Count = int64(len(w.Slots))

			return
		}
	}
}

// Release frees the slots a request admitted at c.Now holds in c's
// concurrency layers, once its response has ended. Other layers are left
// alone: what they counted stays spent.
func Release(s *WindowStore, c *rule.Charge) {
	s.Mu.Lock()

	for i, l := range c.Layers {
		if l.Alg != algConcurrency {
			continue
		}

		if w := l.Entries[c.Keys[i]]; w != nil && w.List == l.List {
			releaseSlot(w, c.Now+l.Duration)
		}
	}

	s.Mu.Unlock()
}

// InFlight is the slots held in a concurrency layer's key at now (0 for a
// key with none).
func InFlight(s *WindowStore, layer, key string, now int64) int64 {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	w := s.Maps[layer][key]
	if w == nil {
		return 0
	}

	return HeldAt(w, now)
}

// HeldAt is the slots of a concurrency layer's window w whose lease runs at
// now.
func HeldAt(w *counter.Entry, now int64) int64 {
	n := int64(0)
	for _, end := range w.Slots {
		if end > now {
			n++
		}
	}

	return n
}

// Mirror records in memory the slot Redis gave a request of key at now, so
// that this process's requests in flight show on its status page and in its
// metrics, and its memory fallback counts them should Redis fail while they
// run; Release frees it with the request's. It counts no decision and checks
// no limit: Redis decided.
func Mirror(s *WindowStore, l *rule.Layer, key string, now int64) {
	s.Mu.Lock()
	s.Takes++

	w := l.Entries[key]
	if w == nil || w.List != l.List {
		w = s.Restart(now, l, w, key)
		w.Slots = nil
	}

	w.Taken = s.Takes
	w.Slots = append(dropEnded(w.Slots, now), now+l.Duration)
	w.Count = int64(len(w.Slots))
	counter.Requeue(w.List, w)
	w.Start = now
	w.Reset = now + l.Duration
	w.Expire = w.Reset

	s.Mu.Unlock()
}
