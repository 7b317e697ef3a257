package tierlimit

import (
	"testing"

	"github.com/tierlimit/tierlimit/redisstore"
)

// TestReleasedSyncStateSendsItsPendingCharges: a synced middleware no
// configuration uses any more is released with charges its last sync did
// not send (an interval longer than the release grace): they reach Redis,
// where a replica, or the middleware configured again, finds them.
func TestReleasedSyncStateSendsItsPendingCharges(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, nil) // syncInterval 1h
	client := "203.0.113.31"

	for i := 0; i < 3; i++ {
		if !takeOn(st, h, client) {
			t.Fatalf("request %d refused", i+1)
		}
	}

	redisstore.StopSync(st)

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())

	if v, err := admin.Do("GET", redisstore.SyncKey(ip, client, false, start)); err != nil || v.Str != "3" {
		t.Fatalf("the released state's charges in Redis: %q %v, want 3", v.Str, err)
	}
}

// TestReleasedBackendFirstSendsItsSyncedCharges: the backend of a removed
// synced middleware is released at the same grace as its synced state, and
// may go first: its pool sends the state's pending points before it closes.
func TestReleasedBackendFirstSendsItsSyncedCharges(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, nil) // syncInterval 1h
	client := "203.0.113.32"

	for i := 0; i < 4; i++ {
		if !takeOn(st, h, client) {
			t.Fatalf("request %d refused", i+1)
		}
	}

	redisstore.CloseBackend(st.Backend)

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())

	if v, err := admin.Do("GET", redisstore.SyncKey(ip, client, false, start)); err != nil || v.Str != "4" {
		t.Fatalf("the synced charges in Redis after the backend closed: %q %v, want 4", v.Str, err)
	}
}
