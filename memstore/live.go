package memstore

import (
	"context"

	"github.com/tierlimit/tierlimit/lifetime"
)

// Stores holds one WindowStore per middleware name while some instance of
// the middleware uses it or it holds counts that still matter (Live,
// ../lifetime/lifetime.go). Traefik keeps one interpreter per plugin, so it
// survives configuration reloads and is shared by every router that uses
// the middleware.
var Stores = lifetime.NewKeepingRegistry(Live)

// StoreOf returns the store of the middleware called name, held until ctx
// is cancelled, creating it with the cap capacity or applying capacity to
// the existing one.
func StoreOf(ctx context.Context, name string, capacity int) *WindowStore {
	v := Stores.Take(ctx, name, func() interface{} { return NewWindowStore(capacity) })

	s, _ := v.(*WindowStore)
	s.SetMax(capacity)

	return s
}

// Live is the memory store's lifetime.Live: the latest end of its counters (a fixed
// or calendar window's reset, a sliding window's reset plus one duration, a
// token bucket's refill) and of its blocks.
func Live(v interface{}, now int64) int64 {
	s, ok := v.(*WindowStore)
	if !ok {
		return 0
	}

	s.Mu.Lock()
	defer s.Mu.Unlock()

	var until int64

	for _, m := range s.Maps {
		for _, w := range m {
			if w.Expire > until {
				until = w.Expire
			}
		}
	}

	for _, m := range s.Blocks {
		until = LatestAfter(m, until)
	}

	return until
}

// LatestAfter returns the latest of until and the values of m.
func LatestAfter(m map[string]int64, until int64) int64 {
	for _, end := range m {
		if end > until {
			until = end
		}
	}

	return until
}
