// Package memstore is the memory store: the counters of the layers an
// instance counts in the Traefik process (WindowStore), fixed windows
// (store.go), sliding windows (sliding.go) and token buckets (bucket.go),
// the blocks of blockDuration (block.go), the points a refused request
// gives back to the layers before the refusing one (giveback.go), the check
// of a countStatus route's layer, which evaluates without charging
// (check.go), and how long a store that no instance holds still matters
// (live.go). Take, the decision of one request, is generated from the root's
// paths.tmpl into take_gen.go (../doc.go: generated paths): edit the
// template, never take_gen.go.
//
// It takes a rule.Charge (the layers and each one's key) and writes a
// rule.Tally, never an *http.Request, and imports only rule, limit,
// lifetime (its registry, live.go) and counter (the types of its counters: a
// layer's table of them, which Attach makes and the layer points to). It
// names rule's and limit's constants through aliases (aliases.go; ../doc.go:
// qualified names). The Redis store (redisstore) uses it as its fallback and for the
// layers a Redis instance counts in memory (../redisstore/mixed.go).
package memstore
