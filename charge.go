package tierlimit

// charge is a request's charge as the stores take it: the layers and each
// layer's key, computed from the request's facts once (the keys snippet of
// paths.tmpl: chargeOf, serveGeneral, decide), never the request itself.
// The stores, the fallback, synced counters, the block list and an outage's
// debts count by these keys.
type charge struct {
	layers    []*layer
	keys      []string // keys[i] is layers[i]'s key (layer.keyFor)
	client    string   // the client's key, which events name
	principal string   // the request's principal ("": none), for the charges after the response (countstatus.go)
	now       int64
	all       bool // the top-level dry run: every layer charged and evaluated
}

// chargePrefix is c for its first n layers.
func chargePrefix(c *charge, n int) *charge {
	return &charge{layers: c.layers[:n], keys: c.keys[:n], client: c.client, principal: c.principal, now: c.now, all: c.all}
}

// chargeAt is c for the layers at index, in that order (an empty index: no
// layer).
func chargeAt(c *charge, index []int) *charge {
	part := &charge{client: c.client, principal: c.principal, now: c.now, all: c.all}
	for _, i := range index {
		part.layers = append(part.layers, c.layers[i])
		part.keys = append(part.keys, c.keys[i])
	}

	return part
}

// chargeWithout is c without the layers whose bit is set in skip.
func chargeWithout(c *charge, skip uint64) *charge {
	if skip == 0 {
		return c
	}

	part := &charge{client: c.client, principal: c.principal, now: c.now, all: c.all}
	for i, l := range c.layers {
		if skip&(uint64(1)<<uint(i)) == 0 {
			part.layers = append(part.layers, l)
			part.keys = append(part.keys, c.keys[i])
		}
	}

	return part
}
