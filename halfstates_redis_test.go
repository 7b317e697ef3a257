package tierlimit

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/status"
)

// A Redis that answers but refuses writes: each test puts a real
// redis-server into one of its half-states with the commands an operator
// meets them by, and checks one episode of it: every request decided (200,
// never a 5xx), counted right by the memory fallback, one REDIS_UNAVAILABLE
// naming the state, no REDIS_RECOVERED while writes fail (however many
// probes, the background one's and a request's after the back-off on the
// injected clock), one REDIS_RECOVERED once Redis takes writes again, and
// Redis counting again after it with the outage's charges paid.

// halfState is a way into a Redis half-state and out of it again.
type halfState struct {
	reason string                                                        // the word the event and the status page give
	args   func(t *testing.T, port string) []string                      // the server's extra arguments
	enter  func(t *testing.T, addr string, admin *redisresp.Pool) func() // returns how to leave
	wiped  bool                                                          // the state loses the server's data (a full resync)
}

// halfStateEpisode runs one episode of st on a server of its own: 5
// requests before, 11 during (one fails on Redis, 9 in the back-off, one
// the back-off's probe on the injected clock), 5 after.
func halfStateEpisode(t *testing.T, st halfState) {
	t.Helper()

	addr, admin := startRedisServer(t, func(port string) []string {
		if st.args == nil {
			return nil
		}

		return st.args(t, port)
	})
	redisDo(t, admin, readmeACL(t)...)

	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.IP = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.Status.Path = "/_ratelimit"
		c.Redis.DialTimeout = "1s" // each probe dials (a loading server accepts between keys)
	})
	b, events := probing(t, h)

	client := "203.0.113.40"
	key := h.p.layers[0].RedisKey + client

	send := func(n int) {
		t.Helper()

		for i := 0; i < n; i++ {
			if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
				t.Fatalf("request answered %d %s, want 200", rec.Code, rec.Body.String())
			}

			h.clock.Add(time.Millisecond)
		}
	}

	send(5)

	if got := redisDo(t, admin, "GET", key).Str; got != "5" {
		t.Fatalf("Redis holds %q before the episode, want 5", got)
	}

	leave := st.enter(t, addr, admin)
	send(1)

	// The background probe fails twice (200 ms, then 400 ms of real time:
	// it waits on the wall clock), or ends the outage.
	waitFor(t, "two failed probes, or a recovery", func() bool {
		b.Mu.Lock()
		defer b.Mu.Unlock()

		return b.Backoff >= 4*redisstore.MinBackoff || b.Backoff == 0
	})

	send(9)

	// Past any back-off on the injected clock: the next request probes.
	h.clock.Add(10 * time.Second)
	send(1)

	wantEvents(t, events.String(), 1, 0, st.reason)

	if got := fallbackMetric(t, h); got != "1" {
		t.Fatalf("tierlimit_redis_fallback %s while writes fail, want 1", got)
	}

	if got := statusReason(t, h); got != st.reason {
		t.Fatalf("status page redisFallbackReason %q, want %q", got, st.reason)
	}

	if got := peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", client); got != 16 {
		t.Fatalf("memory fallback count %d, want 16 (5 Redis reported + 11 during the episode)", got)
	}

	leave()
	waitFor(t, "the metric to go back to 0", func() bool { return fallbackMetric(t, h) == "0" })
	wantEvents(t, events.String(), 1, 1, st.reason)

	send(5)

	want := "21"
	if st.wiped {
		want = "16" // the 5 before were replaced by the other server's data
	}

	waitFor(t, "Redis to count the episode's charges and the 5 after", func() bool {
		return redisDo(t, admin, "GET", key).Str == want
	})

	// NOSCRIPT is no outage: the script is loaded again.
	redisDo(t, admin, "SCRIPT", "FLUSH")
	send(1)
	wantEvents(t, events.String(), 1, 1, st.reason)
}

// wantEvents checks the REDIS_UNAVAILABLE and REDIS_RECOVERED lines of out,
// and that the first REDIS_UNAVAILABLE gives reason.
func wantEvents(t *testing.T, out string, unavailable, recovered int, reason string) {
	t.Helper()

	u, r := strings.Count(out, `"REDIS_UNAVAILABLE"`), strings.Count(out, `"REDIS_RECOVERED"`)
	if u != unavailable || r != recovered {
		t.Fatalf("%d REDIS_UNAVAILABLE and %d REDIS_RECOVERED, want %d and %d:\n%s", u, r, unavailable, recovered, out)
	}

	for _, line := range strings.Split(out, "\n") {
		var ev struct {
			Event  string `json:"event"`
			Reason string `json:"reason"`
		}

		if json.Unmarshal([]byte(line), &ev) == nil && ev.Event == "REDIS_UNAVAILABLE" {
			if ev.Reason != reason {
				t.Fatalf("REDIS_UNAVAILABLE with reason %q, want %q:\n%s", ev.Reason, reason, line)
			}

			return
		}
	}
}

// infoField is field's value in INFO section.
func infoField(t *testing.T, admin *redisresp.Pool, section, field string) string {
	t.Helper()

	for _, line := range strings.Split(redisDo(t, admin, "INFO", section).Str, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}

	return ""
}

// TestAReadOnlyRedisIsOneOutage: a primary demoted to a replica of another
// server (REPLICAOF, what a client with a stale address meets after a
// failover) answers READONLY to every write while PING and reads work.
func TestAReadOnlyRedisIsOneOutage(t *testing.T) {
	// The replica writes the primary's data to its directory.
	dir := t.TempDir()

	halfStateEpisode(t, halfState{reason: "readonly", wiped: true,
		args: func(*testing.T, string) []string { return []string{"--dir", dir} },
		enter: func(t *testing.T, addr string, admin *redisresp.Pool) func() {
			other, _ := startRedisServer(t, func(string) []string { return []string{"--repl-diskless-sync-delay", "0", "--dir", dir} })
			host, port, _ := strings.Cut(other, ":")
			redisDo(t, admin, "REPLICAOF", host, port)

			// Synced: the server holds the other's data, deterministically.
			waitFor(t, "the replica's link", func() bool { return infoField(t, admin, "replication", "master_link_status") == "up" })

			return func() { redisDo(t, admin, "REPLICAOF", "NO", "ONE") }
		}})
}

// TestAnOutOfMemoryRedisIsOneOutage: maxmemory reached with noeviction: every
// write answers OOM.
func TestAnOutOfMemoryRedisIsOneOutage(t *testing.T) {
	halfStateEpisode(t, halfState{reason: "oom", enter: func(t *testing.T, addr string, admin *redisresp.Pool) func() {
		redisDo(t, admin, "CONFIG", "SET", "maxmemory-policy", "noeviction")
		redisDo(t, admin, "CONFIG", "SET", "maxmemory", "1")

		return func() { redisDo(t, admin, "CONFIG", "SET", "maxmemory", "0") }
	}})
}

// TestAReplicaOfAStoppedPrimaryIsOneOutage: a replica whose primary is gone,
// with replica-serve-stale-data no, answers MASTERDOWN to every command.
func TestAReplicaOfAStoppedPrimaryIsOneOutage(t *testing.T) {
	halfStateEpisode(t, halfState{reason: "masterdown", enter: func(t *testing.T, addr string, admin *redisresp.Pool) func() {
		host, port, _ := strings.Cut(closedPort(t), ":")
		redisDo(t, admin, "CONFIG", "SET", "replica-serve-stale-data", "no")
		redisDo(t, admin, "REPLICAOF", host, port)

		return func() { redisDo(t, admin, "REPLICAOF", "NO", "ONE") }
	}})
}

// TestARedisThatCannotSaveIsOneOutage: a background save that failed, with
// stop-writes-on-bgsave-error (the default) and a save schedule, makes every
// write answer MISCONF until a save succeeds. The save fails because the
// file's name is taken by a directory (the tests run as root, whom a
// read-only directory does not stop).
func TestARedisThatCannotSaveIsOneOutage(t *testing.T) {
	dir := t.TempDir()

	halfStateEpisode(t, halfState{reason: "misconf",
		args: func(*testing.T, string) []string { return []string{"--dir", dir, "--dbfilename", "dump.rdb"} },
		enter: func(t *testing.T, addr string, admin *redisresp.Pool) func() {
			redisDo(t, admin, "CONFIG", "SET", "save", "3600 1000000")
			redisDo(t, admin, "CONFIG", "SET", "stop-writes-on-bgsave-error", "yes")

			if err := os.MkdirAll(filepath.Join(dir, "dump.rdb", "taken"), 0o755); err != nil {
				t.Fatal(err)
			}

			bgsave(t, admin, "err")

			return func() {
				if err := os.RemoveAll(filepath.Join(dir, "dump.rdb")); err != nil {
					t.Fatal(err)
				}

				bgsave(t, admin, "ok")
			}
		}})
}

// bgsave runs a background save and waits for its outcome, want.
func bgsave(t *testing.T, admin *redisresp.Pool, want string) {
	t.Helper()

	redisDo(t, admin, "BGSAVE")
	waitFor(t, "the background save", func() bool {
		return infoField(t, admin, "persistence", "rdb_bgsave_in_progress") == "0"
	})

	if got := infoField(t, admin, "persistence", "rdb_last_bgsave_status"); got != want {
		t.Fatalf("background save %s, want %s", got, want)
	}
}

// TestARedisBusyWithAScriptIsOneOutage: a long script from another client
// makes every other command answer BUSY (past busy-reply-threshold) until it
// is killed (SCRIPT KILL).
func TestARedisBusyWithAScriptIsOneOutage(t *testing.T) {
	halfStateEpisode(t, halfState{reason: "busy", enter: func(t *testing.T, addr string, admin *redisresp.Pool) func() {
		redisDo(t, admin, "CONFIG", "SET", "busy-reply-threshold", "20")

		long := redisresp.NewPool(redisresp.Options{Address: addr, Timeout: time.Minute})
		t.Cleanup(long.Close)

		// Bounded: 60 s of Redis's clock at most, should the kill not come.
		done := make(chan string, 1)
		go func() {
			v, err := long.Do("EVAL", `local t = tonumber(redis.call('TIME')[1])
while tonumber(redis.call('TIME')[1]) < t + 60 do end
return 1`, "0")
			done <- v.Str + " " + errString(err)
		}()

		waitFor(t, "the script to make the server busy", func() bool {
			v, err := admin.Do("PING")
			return err == nil && strings.HasPrefix(v.Str, "BUSY")
		})

		return func() {
			redisDo(t, admin, "SCRIPT", "KILL")

			if out := <-done; !strings.Contains(out, "killed") {
				t.Fatalf("the long script ended with %q, not killed", out)
			}
		}
	}})
}

func errString(err error) string {
	if err == nil {
		return ""
	}

	return err.Error()
}

// TestALoadingRedisIsOneOutage: a server loading its data set (DEBUG
// RELOAD, as at a restart, made slow with key-load-delay) answers LOADING to
// every command until the load ends.
func TestALoadingRedisIsOneOutage(t *testing.T) {
	dir := t.TempDir()

	halfStateEpisode(t, halfState{reason: "loading",
		args: func(*testing.T, string) []string { return []string{"--dir", dir, "--enable-debug-command", "yes"} },
		enter: func(t *testing.T, addr string, admin *redisresp.Pool) func() {
			// 2000 keys of 1 KiB loaded 2 ms apart: about 4 s of LOADING, the
			// server answering between keys.
			redisDo(t, admin, "DEBUG", "POPULATE", "2000", "filler", "1024")
			redisDo(t, admin, "CONFIG", "SET", "key-load-delay", "2000")
			redisDo(t, admin, "CONFIG", "SET", "loading-process-events-interval-bytes", "1024")

			reload := redisresp.NewPool(redisresp.Options{Address: addr, Timeout: time.Minute})
			t.Cleanup(reload.Close)

			done := make(chan string, 1)
			go func() {
				v, err := reload.Do("DEBUG", "RELOAD")
				done <- v.Str + " " + errString(err)
			}()

			waitFor(t, "the server to load", func() bool {
				v, err := admin.Do("PING")
				return err == nil && strings.HasPrefix(v.Str, "LOADING")
			})

			return func() {
				if out := <-done; !strings.HasPrefix(out, "OK") {
					t.Fatalf("DEBUG RELOAD: %q", out)
				}
			}
		}})
}

// statusReason is the status page's redisFallbackReason.
func statusReason(t *testing.T, h *harness) string {
	t.Helper()

	body, code := status.JSON(statusOf(h.p), httptest.NewRequest(http.MethodGet, "/_ratelimit", nil), h.clock.Now().UnixNano())

	var doc struct {
		Reason string `json:"redisFallbackReason"`
	}

	if err := json.Unmarshal(body, &doc); err != nil || code != http.StatusOK {
		t.Fatalf("status page %d %s: %v", code, body, err)
	}

	return doc.Reason
}

// TestACheckOnlyRequestDoesNotEndAReadOnlyOutage: a request whose call only
// reads (a countStatus route checks its budget up front and charges after
// the response) is answered by a read-only replica too; as the back-off's
// probe it must not end the outage, since the charge after its response,
// and every other request's, would fail again: Redis has recovered when the
// probe's write succeeds.
func TestACheckOnlyRequestDoesNotEndAReadOnlyOutage(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.IP.Points = 0
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 100, Duration: "1h", CountStatus: []int{401}}}
	})
	_, events := probing(t, h)
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusUnauthorized) })

	login := func() {
		t.Helper()

		if rec := h.get("/login", "203.0.113.41:1"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("login answered %d %s, want the backend's 401", rec.Code, rec.Body.String())
		}
	}

	login()

	// A replica of a stopped primary: its data and reads stay, writes fail.
	host, port, _ := strings.Cut(closedPort(t), ":")
	redisDo(t, admin, "REPLICAOF", host, port)

	login() // its charge fails: the outage starts

	for i := 0; i < 3; i++ {
		h.clock.Add(10 * time.Second) // past the back-off: this login probes
		login()
	}

	wantEvents(t, events.String(), 1, 0, "readonly")

	if got := peekCount(h.p.memory, h.clock.Now().UnixNano(), "login", "203.0.113.41"); got != 5 {
		t.Fatalf("memory fallback count %d, want 5 (1 Redis reported, 4 during the outage)", got)
	}

	redisDo(t, admin, "REPLICAOF", "NO", "ONE")
	h.clock.Add(10 * time.Second)
	login()
	wantEvents(t, events.String(), 1, 1, "readonly")
}

// TestOneProbeEndsAnOutageThatKilledEveryConnection: an outage that killed
// every connection of the pool (a network cut, a restart) ends at the first
// probe once Redis is back: the probe does not fail on the dead
// connections the pool still holds idle, one back-off each.
func TestOneProbeEndsAnOutageThatKilledEveryConnection(t *testing.T) {
	f := newFlap(t, "fixed", "203.0.113.42")
	h, proxy := f.h, f.proxy
	b := h.p.stores.redis.Backend

	// Four connections, all idle afterwards: four calls at once, each held
	// by a script that waits 50 ms on Redis's clock.
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = b.Single.Do("EVAL", `local t = redis.call('TIME')
local stop = t[1] * 1000000 + t[2] + 50000
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop
return 1`, "0")
		}()
	}
	wg.Wait()

	f.send(1)
	proxy.cut()
	f.send(1)

	if !b.Down.Load() {
		t.Fatal("the cut did not start an outage")
	}

	proxy.restore()
	h.clock.Add(time.Minute)
	f.send(1)

	if b.Down.Load() {
		t.Fatal("Redis is back, but the first probe after the back-off failed: it ran on a connection the cut killed")
	}

	if f.allowed != 3 {
		t.Fatalf("%d of 3 requests allowed", f.allowed)
	}
}

// TestAnOutageNamesHowTheConnectionFailed: the reason of REDIS_UNAVAILABLE
// and of the status page when Redis does not answer at all: nothing listens
// (refused), a server that accepts and never answers (timeout), one that
// closes every connection (closed).
func TestAnOutageNamesHowTheConnectionFailed(t *testing.T) {
	listen := func(serve func(net.Conn)) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}

		t.Cleanup(func() { l.Close() })

		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}

				serve(c)
			}
		}()

		return l.Addr().String()
	}

	var held []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()

		for _, c := range held {
			c.Close()
		}
	})

	for reason, addr := range map[string]string{
		"refused": closedPort(t),
		"timeout": listen(func(c net.Conn) { mu.Lock(); held = append(held, c); mu.Unlock() }),
		"closed":  listen(func(c net.Conn) { c.Close() }),
	} {
		h, logs := redisHarness(t, addr, func(c *Config) {
			c.Redis.Timeout = "100ms"
			c.Status.Path = "/_ratelimit"
		})

		if rec := h.get("/api", "203.0.113.43:1"); rec.Code != http.StatusOK {
			t.Fatalf("%s: answered %d, want 200 from memory", reason, rec.Code)
		}

		wantEvents(t, logs.String(), 1, 0, reason)

		if got := statusReason(t, h); got != reason {
			t.Fatalf("status page redisFallbackReason %q, want %q", got, reason)
		}
	}
}

// TestAReadOnlyRedisIsOneOutageForSyncedCounters: with redis.syncInterval,
// a read-only Redis fails the leases and the syncs; the probes (the
// background one, a lease's after the back-off on the injected clock, a
// sync's) write, so it stays one outage until Redis takes writes again.
func TestAReadOnlyRedisIsOneOutageForSyncedCounters(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		synced(c)
		c.IP = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.Status.Path = "/_ratelimit"
	})
	b, events := probing(t, h)
	st := syncedOf(t, h)

	clients := 0
	send := func() {
		t.Helper()

		clients++ // a new key: it needs a lease
		if rec := h.get("/api", "203.0.113."+strconv.Itoa(clients)+":1"); rec.Code != http.StatusOK {
			t.Fatalf("request answered %d %s, want 200", rec.Code, rec.Body.String())
		}
	}

	send()

	host, port, _ := strings.Cut(closedPort(t), ":")
	redisDo(t, admin, "REPLICAOF", host, port)
	send()

	waitFor(t, "two failed probes, or a recovery", func() bool {
		b.Mu.Lock()
		defer b.Mu.Unlock()

		return b.Backoff >= 4*redisstore.MinBackoff || b.Backoff == 0
	})

	for i := 0; i < 3; i++ {
		h.clock.Add(10 * time.Second) // past the back-off: the lease probes
		send()
		_ = redisstore.SyncNow(st, h.clock.Now().UnixNano(), false)
	}

	wantEvents(t, events.String(), 1, 0, "readonly")

	if got := statusReason(t, h); got != "readonly" {
		t.Fatalf("status page redisFallbackReason %q, want readonly", got)
	}

	// Past the back-off: the next lease's probe (or the background one)
	// finds Redis taking writes.
	redisDo(t, admin, "REPLICAOF", "NO", "ONE")
	h.clock.Add(10 * time.Second)
	send()

	if got := fallbackMetric(t, h); got != "0" {
		t.Fatalf("tierlimit_redis_fallback %s once Redis takes writes, want 0", got)
	}

	mustSync(t, st, h.clock.Now().UnixNano())
	wantEvents(t, events.String(), 1, 1, "readonly")
}
