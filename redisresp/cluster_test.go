package redisresp

import "testing"

// Values from the Redis Cluster specification and redis-cli CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	cases := map[string]int{
		"123456789":            12739, // CRC16 XMODEM check value 0x31C3
		"foo":                  12182,
		"bar":                  5061,
		"{user1000}.following": Slot("user1000"),
		"{user1000}.followers": Slot("user1000"),
		"foo{{bar}}zap":        Slot("{bar"),
		"foo{bar}{zap}":        Slot("bar"),
		"":                     0,
	}

	for key, want := range cases {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}

	// From redis-server 7.0's CLUSTER KEYSLOT.
	for key, want := range map[string]int{"foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "ratelimit:m@file:ip:{1.2.3.4}": 1781} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d (CLUSTER KEYSLOT)", key, got, want)
		}
	}
}
