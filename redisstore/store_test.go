package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

func TestBlockListIsBounded(t *testing.T) {
	b := NewBlockList(10)

	for i := 0; i < 1000; i++ {
		b.Add("ip", strconv.Itoa(i), t0+int64(time.Minute), t0)
	}

	if len(b.Until) > 10 {
		t.Fatalf("%d keys held, cap 10", len(b.Until))
	}

	if !b.Add("ip", "expired", t0+1, t0) || b.ResetOf("ip", "expired", t0+1) != 0 {
		t.Fatal("an expired block is still held")
	}
}

func TestMergeSlotRepliesStopsAtTheFirstRefusalInLayerOrder(t *testing.T) {
	layers := []*rule.Layer{{Limits: rule.Limits{Name: "global", Capacity: 10}}, {Limits: rule.Limits{Name: "ip", Capacity: 5}}, {Limits: rule.Limits{Name: "login", Capacity: 3}}}
	// global alone in one slot; ip and login share the client's.
	groups := []*slotGroup{{Layers: []int{0}}, {Layers: []int{1, 2}}}

	cases := []struct {
		name    string
		replies []redisresp.Reply
		all     bool
		want    string
	}{
		{"all allowed", []redisresp.Reply{{Ints: []int64{3, 900}}, {Ints: []int64{2, 800, 1, 700}}}, false, "[3 900 2 800 1 700]"},
		{"global refuses: the client's charges are left out", []redisresp.Reply{{Ints: []int64{11, 900}}, {Ints: []int64{2, 800, 1, 700}}}, false, "[11 900]"},
		{"ip refuses and its call stops", []redisresp.Reply{{Ints: []int64{3, 900}}, {Ints: []int64{6, 800}}}, false, "[3 900 6 800]"},
		{"dry run keeps every layer", []redisresp.Reply{{Ints: []int64{11, 900}}, {Ints: []int64{6, 800, 4, 700}}}, true, "[11 900 6 800 4 700]"},
		{"a short reply without a refusal stops the merge", []redisresp.Reply{{Ints: []int64{3, 900}}, {Ints: []int64{}}}, false, "[3 900]"},
	}

	for _, tc := range cases {
		ints, serverErr, err := mergeSlotReplies(layers, groups, tc.replies, tc.all)
		if err != nil || serverErr != "" || fmt.Sprint(ints) != tc.want {
			t.Errorf("%s: %v %q %v, want %s", tc.name, ints, serverErr, err, tc.want)
		}
	}

	_, serverErr, _ := mergeSlotReplies(layers, groups, []redisresp.Reply{{Ints: []int64{3, 900}}, {ServerErr: "CLUSTERDOWN The cluster is down"}}, false)
	if serverErr != "CLUSTERDOWN The cluster is down" {
		t.Errorf("a call's server error: %q", serverErr)
	}
}

// TestLeaseScriptGrantsWhatLeaseGrantSays: the lease script on a real
// redis-server grants, for each count, need and want, what limit.LeaseGrant
// computes, settles the points added and given back first, and leaves the
// count plus the grant in the key.
func TestLeaseScriptGrantsWhatLeaseGrantSays(t *testing.T) {
	_, admin := startRedis(t)

	for i, tt := range []struct{ count, add, back, need, want, points int64 }{
		{0, 0, 0, 1, 200, 200},
		{150, 0, 0, 1, 200, 200},
		{197, 0, 0, 1, 200, 200},
		{199, 0, 0, 5, 200, 200},
		{200, 0, 0, 1, 200, 200},
		{190, 0, 0, 5, 200, 200},
		{100, 7, 0, 0, 30, 200},
		{100, 0, 40, 1, 200, 200},
		{10, 0, 40, 1, 200, 200},
		{0, 0, 0, 0, 0, 200},
		{5, 0, 0, 1, 1000000, 1000000000},
	} {
		key := "lease:" + strconv.Itoa(i)
		if tt.count > 0 {
			redisDo(t, admin, "SET", key, strconv.FormatInt(tt.count, 10))
		}

		reply := redisDo(t, admin, "EVAL", leaseScript, "1", key,
			strconv.FormatInt(tt.add, 10), strconv.FormatInt(tt.back, 10), strconv.FormatInt(tt.need, 10),
			strconv.FormatInt(tt.want, 10), "60000", strconv.FormatInt(tt.points, 10))

		settled := tt.count + tt.add - tt.back
		if settled < 0 {
			settled = 0
		}

		grant := limit.LeaseGrant(tt.points, settled, tt.need, tt.want)
		if len(reply.Array) != 2 || reply.Array[0].Int != grant || reply.Array[1].Int != settled+grant {
			t.Errorf("%+v: script %v, want grant %d and count %d", tt, reply.Array, grant, settled+grant)
		}
	}
}

func TestSyncGoroutineStopsWhenReleased(t *testing.T) {
	st := NewSyncState()
	st.Max, st.Interval = 10, time.Millisecond

	st.Mu.Lock()
	StartSync(st)
	stop := st.Stop
	st.Mu.Unlock()

	done := make(chan struct{})
	go func() {
		runSync(st, stop) // a second loop on the same channel: it returns when stop closes
		close(done)
	}()

	stopSync(st)
	<-done

	if st.Started {
		t.Fatal("a released state still counts as started")
	}
}

func TestResetMessagesRoundTripAndOthersAreDropped(t *testing.T) {
	for _, c := range [][3]string{
		{"edge@file", "ip", "203.0.113.7"},
		{"edge@file", "route-login", "ip:2001:db8::1"},
		{"m", "l", "key\x00with a NUL"},
	} {
		name, layer, key, ok := parseResetMessage(ResetMessage(c[0], c[1], c[2]))
		if !ok || name != c[0] || layer != c[1] || key != c[2] {
			t.Fatalf("%q: %q %q %q %v", c, name, layer, key, ok)
		}
	}

	for _, payload := range []string{"", "edge@file", "edge@file\x00ip", "edge@file\x00ip\x00", "\x00ip\x00k", "m\x00\x00k"} {
		if _, _, _, ok := parseResetMessage(payload); ok {
			t.Fatalf("%q read as a reset", payload)
		}
	}
}

// A panic in a session (here: logging its failure) ends the session, not
// the process.
func TestResetSessionRecoversFromPanics(t *testing.T) {
	r := NewResetListener(&RedisBackend{}, redisresp.Options{Address: closedPort(t)})
	r.Event = func(string) { panic("logging") }

	if r.Session(0) {
		t.Fatal("a session that panicked reports a subscription")
	}
}

func TestReleasedBackendClosesItsPool(t *testing.T) {
	s := newCannedRedis(t, "+PONG\r\n")
	reg := &BackendRegistry{ByConfig: lifetime.NewHeldRegistry(CloseBackend)}
	ft := newFakeTimers(reg.ByConfig)

	opts := redisresp.Options{Address: s.l.Addr().String(), Timeout: time.Second, PoolSize: 4}

	ctx, cancel := context.WithCancel(context.Background())
	b := reg.Get(ctx, opts)

	if _, err := b.Pool.(*redisresp.Pool).Do("PING"); err != nil {
		t.Fatal(err)
	}

	// Another configuration (say, a new password) has a backend of its own.
	other := opts
	other.Password = "rotated"

	if reg.Get(context.Background(), other) == b {
		t.Fatal("two Redis configurations share a pool")
	}

	cancel()
	ft.next(t)()

	if _, err := b.Pool.(*redisresp.Pool).Do("PING"); !errors.Is(err, redisresp.ErrClosed) {
		t.Fatalf("pool of a released backend: %v, want ErrClosed", err)
	}

	if reg.ByConfig.Size() != 1 {
		t.Fatalf("%d backends, want the one still held", reg.ByConfig.Size())
	}
}

var t0 = time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixNano()

// fakeTimers stands in for time.AfterFunc: the grace timers are fired by the
// test, so no test waits for lifetime.ReleaseGrace.
type fakeTimers struct {
	started chan func()
}

func newFakeTimers(r *lifetime.HeldRegistry) *fakeTimers {
	ft := &fakeTimers{started: make(chan func(), 16)}
	r.After = func(d time.Duration, f func()) {
		if d != lifetime.ReleaseGrace {
			panic("grace timer of " + d.String())
		}

		ft.started <- f
	}

	return ft
}

// next returns the next grace timer started; context.AfterFunc runs the
// release on a goroutine of its own, hence the wait (with a deadline).
func (ft *fakeTimers) next(t *testing.T) func() {
	t.Helper()

	select {
	case f := <-ft.started:
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("no grace timer started after the last holder's ctx was cancelled")
		return nil
	}
}
