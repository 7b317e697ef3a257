package limit

// A concurrency layer holds slots, requests in flight at once per key: a
// request takes one whatever its cost, gives it back when it ends, and
// each slot is held at most its lease (the layer's duration).

// SlotFits reports whether a request finds a slot free where held of
// slots are held: held < slots.
func SlotFits(held, slots int64) bool {
	return held < slots
}
