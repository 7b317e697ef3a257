package redisstore

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rule"
)

// BlockList remembers keys that Redis reported over their limit, until their
// reset. It holds at most max keys. An entry is the layer's blockPrefix + the
// key: the prefix holds the layer's limits, so that an entry made under other
// limits (before a reload that raised the points, say) refuses nothing, where
// Redis might now allow.
type BlockList struct {
	Size atomic.Int64 // entries, so that the common case (none) takes no lock

	Mu    sync.Mutex
	max   int
	Until map[string]int64 // by layer.blockPrefix + key
	// noted holds the reset of keys reported refused by a cost that
	// blocks nothing (redisStore.refused), so that their refusals too are
	// reported once per window.
	noted map[string]int64
	// prefixes holds every blockPrefix an entry was made under, so that a
	// reset can find a key's entries without a scan (forgetLayerKey). A few
	// per layer: one per limits a reload gave it.
	prefixes map[string]bool
	// hits counts the requests each block of a blockDuration layer refused
	// (the status page's refused), by entry; a new block starts it again.
	hits map[string]int64
}

func NewBlockList(capacity int) *BlockList {
	return &BlockList{max: capacity, Until: map[string]int64{}, noted: map[string]int64{}, prefixes: map[string]bool{}, hits: map[string]int64{}}
}

// blockPrefix is a layer's part of its block list entries: its name and its
// Redis arguments (points, window, algorithm, rate), each ended by a NUL,
// which neither holds.
func blockPrefix(l *rule.Layer) string {
	return l.Name + "\x00" + l.RedisArgs + "\x00"
}

// ResetOf returns the reset of a blocked key, or 0.
func (b *BlockList) ResetOf(prefix, key string, now int64) int64 {
	if b.Size.Load() == 0 {
		return 0
	}

	id := prefix + key

	b.Mu.Lock()

	reset := b.Until[id]
	if reset != 0 && reset <= now {
		delete(b.Until, id)
		b.Size.Store(int64(len(b.Until)))

		reset = 0
	}

	b.Mu.Unlock()

	return reset
}

// Add blocks a key until reset and reports whether it was not blocked yet, so
// that a refusal is reported once per key and window.
func (b *BlockList) Add(prefix, key string, reset, now int64) bool {
	id := prefix + key

	b.Mu.Lock()
	defer b.Mu.Unlock()

	if old, ok := b.Until[id]; ok && old > now {
		if reset > old {
			b.Until[id] = reset
		}

		return false
	}

	memstore.TrimEntries(b.Until, b.max, now)
	b.Until[id] = reset
	b.prefixes[prefix] = true
	b.Size.Store(int64(len(b.Until)))

	noted := b.noted[id]

	return noted <= now
}

// hit counts a request that the block of a blockDuration layer's key
// refused: the first of a new block (start), or one more. At the cap, the
// counts of entries that are gone are dropped first.
func (b *BlockList) hit(prefix, key string, start bool) {
	id := prefix + key

	b.Mu.Lock()
	defer b.Mu.Unlock()

	if len(b.hits) >= b.max {
		for k := range b.hits {
			if _, ok := b.Until[k]; !ok {
				delete(b.hits, k)
			}
		}
	}

	if start {
		b.hits[id] = 1
		return
	}

	b.hits[id]++
}

// note records that a key refused a request without being blocked, until
// reset, and reports whether no refusal of it was recorded yet (blocked or
// noted) in its window.
func (b *BlockList) note(prefix, key string, reset, now int64) bool {
	id := prefix + key

	b.Mu.Lock()
	defer b.Mu.Unlock()

	if b.Until[id] > now {
		return false
	}

	if old := b.noted[id]; old > now {
		if reset > old {
			b.noted[id] = reset
		}

		return false
	}

	memstore.TrimEntries(b.noted, b.max, now)
	b.noted[id] = reset

	return true
}

// Snapshot copies the keys blocked at now whose key starts with prefix.
func (b *BlockList) Snapshot(now int64, prefix string) []memstore.BlockedKey {
	if b.Size.Load() == 0 {
		return nil
	}

	var out []memstore.BlockedKey

	b.Mu.Lock()

	for id, reset := range b.Until {
		i := strings.IndexByte(id, 0)
		j := -1
		if i >= 0 {
			j = strings.IndexByte(id[i+1:], 0)
		}

		if reset > now && j >= 0 && strings.HasPrefix(id[i+j+2:], prefix) {
			out = append(out, memstore.BlockedKey{Layer: id[:i], Prefix: id[:i+j+2], Key: id[i+j+2:], Reset: reset, Refused: b.hits[id]})
		}
	}

	b.Mu.Unlock()

	return out
}

// BlockListLive is the Redis block list's: the latest end of a block, or of a
// window whose refusal was reported (noted), so that the middleware
// configured again neither asks Redis for a key it knows blocked nor
// reports a window's refusal twice.
func BlockListLive(v interface{}, now int64) int64 {
	b, ok := v.(*BlockList)
	if !ok {
		return 0
	}

	b.Mu.Lock()
	defer b.Mu.Unlock()

	return memstore.LatestAfter(b.noted, memstore.LatestAfter(b.Until, 0))
}

// BlockLists holds one BlockList per middleware name on the Redis store,
// as memstore.Stores holds its memory store, while some instance uses it or
// it holds entries that still matter (BlockListLive).
var BlockLists = lifetime.NewKeepingRegistry(BlockListLive)

// BlockListOf returns the block list of the middleware called name, held
// until ctx is cancelled.
func BlockListOf(ctx context.Context, name string, capacity int) *BlockList {
	v := BlockLists.Take(ctx, name, func() interface{} { return NewBlockList(capacity) })

	b, _ := v.(*BlockList)

	return b
}
