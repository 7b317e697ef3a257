package redisresp

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSwitchMasterAloneMovesCalls: the +switch-master announcement moves
// calls to the new primary it names, by itself. The watcher's periodic
// re-ask, which would find the new primary too, is put out of the test's
// reach (an hour), so a handler that read the announcement's old address
// leaves the calls on the old primary and the test fails.
func TestSwitchMasterAloneMovesCalls(t *testing.T) {
	a, b := startPrimary(t), startPrimary(t)

	var mu sync.Mutex
	current := a.addr()
	sentinel := startSentinel(t, &current, &mu)

	opts := longOptions("")
	opts.Sentinel = &SentinelOptions{MasterName: "mymaster", Addresses: []string{sentinel.addr()}}
	s := NewSentinel(opts)
	s.refresh = time.Hour
	defer s.Close()

	if _, _, err := s.DoInts(take); err != nil {
		t.Fatal(err)
	}

	watcher := switchWatcher(t, sentinel)

	// The failover: the sentinels name b from now on, and announce it.
	mu.Lock()
	current = b.addr()
	mu.Unlock()

	ah, ap, _ := strings.Cut(a.addr(), ":")
	bh, bp, _ := strings.Cut(b.addr(), ":")

	sentinel.mu.Lock()
	nc := sentinel.conns[watcher-1]
	sentinel.mu.Unlock()

	if _, err := nc.Write([]byte("*3\r\n" + bulk("message") + bulk("+switch-master") + bulk("mymaster "+ah+" "+ap+" "+bh+" "+bp))); err != nil {
		t.Fatal(err)
	}

	waitFor(t, "the switch to "+b.addr()+" (primary still "+a.addr()+")", func() bool { return s.Primary() == b.addr() })

	if _, serverErr, err := s.DoInts(take); err != nil || serverErr != "" || b.count("TAKE") != 1 || a.count("TAKE") != 1 {
		t.Fatalf("after the switch: %q %v; calls on a %d, on b %d", serverErr, err, a.count("TAKE"), b.count("TAKE"))
	}

	// Only the announcement moved it: nobody asked the sentinels again.
	if n := sentinel.count("SENTINEL"); n != 2 {
		t.Fatalf("the sentinels were asked %d times, want 2 (the first discovery and the watcher's start)", n)
	}
}
