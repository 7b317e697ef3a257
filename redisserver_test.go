package tierlimit

import (
	"bufio"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
)

// redisServer runs a redis-server of the test's own on a free loopback port,
// persisting nothing, and returns its address and a client for checks. The
// scripts' Lua (5.1, with Redis's number conversions) is only exercised
// for real there.
func redisServer(t *testing.T) (string, *redisresp.Pool) {
	t.Helper()

	addr, admin := startRedisServer(t, func(string) []string { return nil })
	redisDo(t, admin, readmeACL(t)...)

	return addr, admin
}

// startRedisServer runs a redis-server of the test's own on a free loopback
// port, persisting nothing, with the arguments args gives for its port, and
// returns its address and a client (stopped at the test's end).
func startRedisServer(t *testing.T, args func(port string) []string) (string, *redisresp.Pool) {
	t.Helper()

	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("these tests run the rate-limit scripts on a real redis-server, which is not on PATH (apt-get install redis-server): %v", err)
	}

	for attempt := 0; attempt < 5; attempt++ {
		addr := closedPort(t)

		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command(path, append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}, args(port)...)...)

		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}

		if err := cmd.Start(); err != nil {
			t.Fatalf("starting redis-server: %v", err)
		}

		// Ready when it says so; gone (a port taken meanwhile) when its
		// output ends first.
		ready, log := false, ""
		sc := bufio.NewScanner(out)

		for !ready && sc.Scan() {
			log += sc.Text() + "\n"
			ready = strings.Contains(sc.Text(), "Ready to accept connections")
		}

		if !ready {
			_ = cmd.Wait()

			if strings.Contains(log, "Address already in use") {
				continue
			}

			t.Fatalf("redis-server did not start:\n%s", log)
		}

		go func() {
			for sc.Scan() {
			}
		}()

		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})

		admin := redisresp.NewPool(redisresp.Options{Address: addr, Timeout: 2 * time.Second})
		t.Cleanup(admin.Close)

		return addr, admin
	}

	t.Fatal("redis-server: no free port in 5 attempts")

	return "", nil
}

// aclPassword is the password of README.md's ACL user on redisServer.
const aclPassword = "acl-secret"

// readmeACL is README.md's ACL SETUSER command for the plugin's user, with
// aclPassword: the tests' instances connect as that user (asACLUser), so a
// script command the ACL does not grant fails them.
func readmeACL(t *testing.T) []string {
	t.Helper()

	doc, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}

	for _, line := range strings.Split(string(doc), "\n") {
		if args := strings.Fields(line); len(args) > 3 && args[0] == "ACL" && args[1] == "SETUSER" && args[2] == "tierlimit" {
			return strings.Fields(strings.ReplaceAll(line, "PASSWORD", aclPassword))
		}
	}

	t.Fatal("README.md has no ACL SETUSER tierlimit line")

	return nil
}

// asACLUser connects an instance as README.md's ACL user.
func asACLUser(c *Config) {
	c.Redis.Username = "tierlimit"
	c.Redis.Password = aclPassword
}

// redisDo runs a command on the test's server.
func redisDo(t *testing.T, p *redisresp.Pool, args ...string) redisresp.Value {
	t.Helper()

	v, err := p.Do(args...)
	if err != nil || v.IsError() {
		t.Fatalf("redis %v: %+v %v", args, v, err)
	}

	return v
}

// serverState is every key on the server, serialized (DUMP) with its
// absolute expiry (PEXPIRETIME): unchanged unless a script writes the key.
func serverState(t *testing.T, p *redisresp.Pool) string {
	t.Helper()

	var b strings.Builder

	for _, k := range redisDo(t, p, "KEYS", "*").Array {
		b.WriteString(k.Str + " " + strconv.Quote(redisDo(t, p, "DUMP", k.Str).Str) + " " +
			strconv.FormatInt(redisDo(t, p, "PEXPIRETIME", k.Str).Int, 10) + "\n")
	}

	return b.String()
}

// algorithmLayer is a layer of points with algorithm, an hour long; a token
// bucket's burst is points.
func algorithmLayer(algorithm string, points int) config.LayerConfig {
	if algorithm == "tokenbucket" {
		return config.LayerConfig{Points: 1, Duration: "1h", Algorithm: algorithm, Burst: points}
	}

	return config.LayerConfig{Points: points, Duration: "1h", Algorithm: algorithm}
}

// longWindows makes every layer of an instance an hour long, so that no
// window ends while a test runs on Redis's clock.
// A calendar layer keeps its calendar.
func longWindows(c *Config) {
	for _, l := range []struct{ d, cal *string }{
		{&c.Global.Duration, &c.Global.Calendar}, {&c.IP.Duration, &c.IP.Calendar}, {&c.Assets.Duration, &c.Assets.Calendar},
		{&c.User.Duration, &c.User.Calendar}, {&c.Service.Duration, &c.Service.Calendar},
	} {
		if *l.cal == "" {
			*l.d = "1h"
		}
	}

	for i := range c.Routes {
		if c.Routes[i].Calendar == "" {
			c.Routes[i].Duration = "1h"
		}
	}

	for name, pc := range c.Plans {
		if pc.Calendar == "" {
			pc.Duration = "1h"
		}
		c.Plans[name] = pc
	}
}

// TestMemoryAndRedisAgreeOnRedisServer runs one seeded script of requests
// (runScript's vocabulary) through a memory instance and a Redis instance on
// a real redis-server, for each configuration shape: status, every rate-limit
// header, the body, the backend calls and the events must agree.
//
// One allowance: Redis keeps time by its own clock (TTLs, TIME) while the
// memory instance's clock stands still, so a reset Redis reports may be
// earlier by the real time the test has run, rounded up to whole seconds;
// reset-derived values (X-RateLimit-Reset, RateLimit's t, Retry-After, the
// body's reset) may differ by that much, in that direction, and by nothing
// else. Windows last an hour, so no window ends and no token comes back
// meanwhile. The status shape is left out: a status page lists the memory
// store's keys, which differ by design.
func TestMemoryAndRedisAgreeOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)
	start := time.Now()

	for i, sh := range shapes {
		if sh.mode == modeOff || sh.name == "redis" || sh.name == "status" {
			continue
		}

		conf := with(sh.cfg, longWindows)
		a := newHarness(t, conf)
		b, _ := redisHarness(t, addr, with(conf, asACLUser))

		if b.p.stores.redis == nil || a.p.stores == b.p.stores {
			t.Fatalf("%s: stores %T and %T", sh.name, a.p.stores, b.p.stores)
		}

		agreeOnRedis(t, sh.name, int64(i+1), a, b, admin, start)
	}
}

// agreeOnRedis is runScript for a memory instance (a) and a Redis one (b),
// with the clock standing still and TestMemoryAndRedisAgreeOnRedisServer's
// allowances.
func agreeOnRedis(t *testing.T, name string, seed int64, a, b *harness, admin *redisresp.Pool, start time.Time) {
	t.Helper()

	rng := rand.New(rand.NewSource(seed))
	refusals, pending := 0, map[string]int{}

	for i := 0; i < 300; i++ {
		send, desc := scriptRequest(rng)
		calls, evA, evB := scriptCalls(t, admin), a.events.Len(), b.events.Len()
		ra, rb := send(a), send(b)
		local := scriptCalls(t, admin) == calls
		what := name + ": request " + strconv.Itoa(i) + " (" + desc + ")"

		// A key on the block list refuses without asking Redis, and names its
		// own layer, where memory names the first layer that refuses (one
		// Redis has not been asked about): its first refusal is then reported
		// by memory alone, and by Redis once Redis refuses it.
		blocked := local && ra.Code == http.StatusTooManyRequests && rb.Code == http.StatusTooManyRequests &&
			layerIndex(a, refusedLayer(ra)) < layerIndex(a, refusedLayer(rb))

		if msg := differ(ra, rb, a.p.name, b.p.name, int64(time.Since(start)/time.Second)+1); msg != "" && !blocked {
			// One shape's first difference, then the next shape.
			t.Errorf("%s: %s", what, msg)
			return
		}

		linesA := eventLines(a.events.String()[evA:], a.p.name)
		linesB := eventLines(b.events.String()[evB:], b.p.name)

		if msg := matchEvents(linesA, linesB, pending, blocked); msg != "" {
			t.Errorf("%s: %s", what, msg)
			return
		}

		if ra.Code == http.StatusTooManyRequests {
			refusals++
		}
	}

	if a.calls.Load() != b.calls.Load() {
		t.Errorf("%s: backend called %d vs %d times", name, a.calls.Load(), b.calls.Load())
	}

	if len(a.p.layers) > 0 && (a.events.Len() == 0 || refusals == 0 && !a.p.dryRun) {
		t.Errorf("%s: %d refusals, events %q: the script does not reach a refusal", name, refusals, a.events.String())
	}
}

// scriptRequest draws a request from runScript's vocabulary and returns what
// sends it to an instance, and its description.
func scriptRequest(rng *rand.Rand) (func(h *harness) *httptest.ResponseRecorder, string) {
	method := scriptMethods[rng.Intn(len(scriptMethods))]
	path := scriptPaths[rng.Intn(len(scriptPaths))]
	client := scriptClients[rng.Intn(len(scriptClients))]
	cred := scriptCredentials[rng.Intn(len(scriptCredentials))]
	principal := scriptPrincipals[rng.Intn(len(scriptPrincipals))]

	return func(h *harness) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		req.RemoteAddr = client.remote

		if client.forwarded != "" {
			req.Header.Set("X-Forwarded-For", client.forwarded)
		}

		if cred != nil {
			cred(req)
		}

		for k, v := range principal {
			req.Header.Set(k, v)
		}

		rec := httptest.NewRecorder()
		h.h.ServeHTTP(rec, req)

		return rec
	}, method + " " + path + " from " + client.remote
}

// scriptCalls is the number of script calls the server has run.
func scriptCalls(t *testing.T, admin *redisresp.Pool) int64 {
	t.Helper()

	var n int64

	for _, line := range strings.Split(redisDo(t, admin, "INFO", "commandstats").Str, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:calls=") || strings.HasPrefix(line, "cmdstat_eval:calls=") {
			v, _ := strconv.ParseInt(strings.SplitN(strings.SplitN(line, "=", 2)[1], ",", 2)[0], 10, 64)
			n += v
		}
	}

	return n
}

var bodyLayer = regexp.MustCompile(`"layer":"([^"]+)"`)

// refusedLayer is the layer a refusal names: in its body, else its policy.
func refusedLayer(rec *httptest.ResponseRecorder) string {
	if m := bodyLayer.FindStringSubmatch(rec.Body.String()); m != nil {
		return m[1]
	}

	policy := rec.Header().Get("RateLimit-Policy")
	if i := strings.IndexByte(policy, ';'); i > 0 {
		return strings.Trim(policy[:i], `"`)
	}

	return ""
}

// layerIndex is a layer's place in the evaluation order, -1 if unknown.
func layerIndex(h *harness, name string) int {
	for i, l := range h.p.layers {
		if l.Name == name {
			return i
		}
	}

	return -1
}

// eventLines splits events into lines without the instance's name.
func eventLines(events, name string) []string {
	return strings.Fields(strings.ReplaceAll(events, name, ""))
}

var eventIP = regexp.MustCompile(`"ip":"[^"]*",?`)

// matchEvents compares one request's events: the same, but that a request
// refused by the block list (blocked) may miss memory's events, which are
// then pending until Redis reports them (for another request, so for
// another client: the client's address is not compared).
func matchEvents(a, b []string, pending map[string]int, blocked bool) string {
	if blocked && len(b) == 0 {
		for _, e := range a {
			pending[eventIP.ReplaceAllString(e, "")]++
		}

		return ""
	}

	seen := map[string]int{}
	for _, e := range a {
		seen[e]++
	}

	for _, e := range b {
		switch {
		case seen[e] > 0:
			seen[e]--
		case pending[eventIP.ReplaceAllString(e, "")] > 0:
			pending[eventIP.ReplaceAllString(e, "")]--
		default:
			return fmt.Sprintf("Redis reported %s, memory %v", e, a)
		}
	}

	for e, n := range seen {
		if n > 0 {
			return fmt.Sprintf("memory reported %s, Redis %v", e, b)
		}
	}

	return ""
}

var bodyReset = regexp.MustCompile(`"reset":"([^"]+)"`)

// differ describes how the Redis instance's answer rb differs from the
// memory one's ra beyond a reset earlier by at most slack seconds, or is "".
func differ(ra, rb *httptest.ResponseRecorder, nameA, nameB string, slack int64) string {
	if ra.Code != rb.Code {
		return fmt.Sprintf("status %d vs %d", ra.Code, rb.Code)
	}

	// The body's reset, as seconds, joins the reset-derived values.
	bodyA, resetA := splitReset(strings.ReplaceAll(ra.Body.String(), nameA, ""))
	bodyB, resetB := splitReset(strings.ReplaceAll(rb.Body.String(), nameB, ""))

	if bodyA != bodyB {
		return fmt.Sprintf("body %q vs %q", ra.Body.String(), rb.Body.String())
	}

	pairs := [][2]string{{resetA, resetB}}

	for _, k := range rateLimitHeaders {
		va, vb := ra.Header().Get(k), rb.Header().Get(k)

		switch k {
		case "X-RateLimit-Reset", "Retry-After":
			pairs = append(pairs, [2]string{va, vb})
			continue
		case "RateLimit":
			ia, ib := strings.LastIndex(va, ";t="), strings.LastIndex(vb, ";t=")
			if ia >= 0 && ib >= 0 {
				pairs = append(pairs, [2]string{va[ia+3:], vb[ib+3:]})
				va, vb = va[:ia], vb[:ib]
			}
		}

		if va != vb {
			return fmt.Sprintf("%s %q vs %q", k, ra.Header().Get(k), rb.Header().Get(k))
		}
	}

	for _, p := range pairs {
		if p[0] == p[1] {
			continue
		}

		x, errA := strconv.ParseInt(p[0], 10, 64)
		y, errB := strconv.ParseInt(p[1], 10, 64)

		if errA != nil || errB != nil || x-y < 0 || x-y > slack {
			return fmt.Sprintf("reset %q vs %q (allowed: Redis earlier by up to %ds); headers %v vs %v", p[0], p[1], slack, ra.Header(), rb.Header())
		}
	}

	return ""
}

// splitReset takes the reset time out of a refusal body, and returns it as
// Unix seconds ("" without one).
func splitReset(body string) (string, string) {
	m := bodyReset.FindStringSubmatchIndex(body)
	if m == nil {
		return body, ""
	}

	at, err := time.Parse(time.RFC3339, body[m[2]:m[3]])
	if err != nil {
		return body, ""
	}

	return body[:m[2]] + body[m[3]:], strconv.FormatInt(at.Unix(), 10)
}
