package status

import (
	"sort"
	"strings"

	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rule"
)

// liveKey is a live window as the listing copies it: the index of its layer in
// Page.Layers, its key, count and reset (Unix nanoseconds), whether its next
// request is refused, and the requests it refused in this window (a refused
// request is not in the count).
type liveKey struct {
	layer   int
	key     string
	count   int64
	reset   int64
	limited bool
	refused int64
}

// liveFilter is what liveKeys copies: the windows live at now, only those
// at their limit when limitedOnly is set, of keys that start with prefix.
type liveFilter struct {
	now         int64
	limitedOnly bool
	prefix      string
}

// liveKeys copies the live windows of the middleware's layers that pass the
// filter, and returns them unsorted with the number of keys each layer's map
// holds (tracked, aligned with pg.Layers). For the Redis store, the keys Redis
// reported over their limit are merged in, with count points (full) unless the
// memory store (the fallback) knows a higher one.
func liveKeys(pg *Page, now int64, limitedOnly bool, prefix string) ([]liveKey, []int) {
	tracked := make([]int, len(pg.Layers))

	var out []liveKey

	s := pg.Memory
	f := &liveFilter{now: now, limitedOnly: limitedOnly, prefix: prefix}
	s.Mu.Lock()

	for i, l := range pg.Layers {
		m := s.Maps[l.Name]
		tracked[i] = len(m)

		if l.Algorithm == limit.Sliding {
			out = appendSliding(out, i, l, m, f)
			continue
		}

		if l.Algorithm == limit.TokenBucket {
			out = appendBucket(out, i, l, m, f)
			continue
		}

		if l.Algorithm == limit.Concurrency {
			out = appendHeld(out, i, l, m, f)
			continue
		}

		for key, w := range m {
			if w.Reset > now && w.List == l.List && (!limitedOnly || limit.Full(w.Count, l.Capacity)) &&
				(prefix == "" || strings.HasPrefix(key, prefix)) {
				out = append(out, liveKey{layer: i, key: key, count: w.Count, reset: w.Reset, limited: limit.Full(w.Count, l.Capacity), refused: w.Refused})
			}
		}
	}

	s.Mu.Unlock()

	out = mergeBlocked(pg.Layers, out, s.BlockedKeys(now, pg.Layers, prefix))

	if rs := pg.Redis; rs != nil {
		out = mergeBlocked(pg.Layers, out, rs.Blocked.Snapshot(now, prefix))
	}

	return out, tracked
}

// appendSliding is liveKeys' loop for a sliding layer, under the store's lock.
// A sliding counter holds only allowed requests, so its count never exceeds
// the points: the listing shows the weighted count the layer decides on
// (this window's count plus the previous window's share, limit.SlidingCount),
// and a key is limited when its next request would be refused. A counter
// whose window ended less than a duration ago stands for the window that
// followed it (limit.SlidingAt).
func appendSliding(out []liveKey, i int, l *rule.Layer, m map[string]*counter.Entry, f *liveFilter) []liveKey {
	now, limitedOnly, prefix := f.now, f.limitedOnly, f.prefix
	for key, w := range m {
		if w.Expire <= now || w.List != l.List || (prefix != "" && !strings.HasPrefix(key, prefix)) {
			continue
		}

		prev, count, reset := w.PrevCount, w.Count, w.Reset
		if reset <= now {
			prev, count, reset = limit.SlidingAt(prev, count, reset, now, l.Duration)
		}

		est := limit.SlidingCount(prev, count, 0, reset-now, l.Duration)
		if limit.Full(est, l.Capacity) || !limitedOnly {
			out = append(out, liveKey{layer: i, key: key, count: est, reset: reset, limited: limit.Full(est, l.Capacity), refused: w.Refused})
		}
	}

	return out
}

// appendBucket is liveKeys' loop for a token-bucket layer, under the store's
// lock: the live buckets (not full) with their tokens in use as their count,
// limited when the next request would be refused: as for a window, when the
// count is at the points (a take fits while the tokens in use plus its cost
// are at most the burst, limit.BucketTake).
func appendBucket(out []liveKey, i int, l *rule.Layer, m map[string]*counter.Entry, f *liveFilter) []liveKey {
	now, limitedOnly, prefix := f.now, f.limitedOnly, f.prefix
	for key, w := range m {
		if w.Reset <= now || w.List != l.List || (prefix != "" && !strings.HasPrefix(key, prefix)) {
			continue
		}

		_, used := limit.BucketTake(w.Reset, now, 0, l.Capacity, l.Interval)
		limited := limit.Full(used, l.Capacity)
		if limited || !limitedOnly {
			out = append(out, liveKey{layer: i, key: key, count: used, reset: w.Reset, limited: limited, refused: w.Refused})
		}
	}

	return out
}

// appendHeld is liveKeys' loop for a concurrency layer, under the store's
// lock: the keys holding slots in memory, their count the requests in
// flight, their reset the last lease's end, limited while every slot is
// held.
func appendHeld(out []liveKey, i int, l *rule.Layer, m map[string]*counter.Entry, f *liveFilter) []liveKey {
	for key, w := range m {
		if w.List != l.List || (f.prefix != "" && !strings.HasPrefix(key, f.prefix)) {
			continue
		}

		held := memstore.HeldAt(w, f.now)
		if held > 0 && (limit.Full(held, l.Capacity) || !f.limitedOnly) {
			out = append(out, liveKey{layer: i, key: key, count: held, reset: w.Expire, limited: limit.Full(held, l.Capacity), refused: w.Refused})
		}
	}

	return out
}

// mergeBlocked adds the block list's keys to the listing; a key listed by both
// keeps the higher count and the later reset.
func mergeBlocked(layers []*rule.Layer, out []liveKey, blocked []memstore.BlockedKey) []liveKey {
	if len(blocked) == 0 {
		return out
	}

	index := make(map[string]int, len(out))
	for i, e := range out {
		index[layers[e.layer].Name+"\x00"+e.key] = i
	}

	for _, b := range blocked {
		li := layerIndex(layers, b.Layer)
		if li < 0 || layers[li].BlockPrefix != b.Prefix {
			continue
		}

		count := layers[li].Capacity

		if i, ok := index[b.Layer+"\x00"+b.Key]; ok {
			out[i].limited = true

			if out[i].count < count {
				out[i].count = count
			}

			if out[i].reset < b.Reset {
				out[i].reset = b.Reset
			}

			if out[i].refused < b.Refused {
				out[i].refused = b.Refused
			}

			continue
		}

		out = append(out, liveKey{layer: li, key: b.Key, count: count, reset: b.Reset, limited: true, refused: b.Refused})
	}

	return out
}

func layerIndex(layers []*rule.Layer, name string) int {
	for i, l := range layers {
		if l.Name == name {
			return i
		}
	}

	return -1
}

// before orders the listing: by count, highest first, then layer name, then key.
func before(layers []*rule.Layer, a, b liveKey) bool {
	if a.count != b.count {
		return a.count > b.count
	}

	if a.layer != b.layer {
		return layers[a.layer].Name < layers[b.layer].Name
	}

	return a.key < b.key
}

// firstSorted returns the first n entries of the listing in order. A page
// near the top of a long listing is selected in one pass (each entry compared
// once with the page's last, and placed by binary search if it belongs on the
// page) rather than sorting every key: each comparison is an interpreted
// call (../doc.go: frames), which made a full sort of a long listing slow.
func firstSorted(layers []*rule.Layer, entries []liveKey, n int) []liveKey {
	if n > len(entries) {
		n = len(entries)
	}

	if n == 0 {
		return nil
	}

	if n > len(entries)/4 {
		sort.Slice(entries, func(i, j int) bool { return before(layers, entries[i], entries[j]) })
		return entries[:n]
	}

	top := make([]liveKey, 0, n+1)

	for _, e := range entries {
		e := e
		if len(top) == n && !before(layers, e, top[n-1]) {
			continue
		}

		i := sort.Search(len(top), func(j int) bool { return before(layers, e, top[j]) })
		top = append(top, liveKey{})
		copy(top[i+1:], top[i:])
		top[i] = e

		if len(top) > n {
			top = top[:n]
		}
	}

	return top
}
