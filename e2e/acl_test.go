package e2e

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// The ACL users the tests create from README's lines, and their passwords.
const (
	aclUser             = "tierlimit"
	aclPassword         = "acl-pw-4k"
	aclSentinelUser     = "tierlimit-sentinel"
	aclSentinelPassword = "acl-pw-7s"
)

// readmeACL returns README's "ACL SETUSER <user> ..." line as arguments, with
// PASSWORD replaced by password: the tests grant exactly what README documents.
func readmeACL(t *testing.T, user, password string) []string {
	t.Helper()

	f, err := os.Open(filepath.Join(harness.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	sc := bufio.NewScanner(f)
	for sc.Scan() {
		args := strings.Fields(sc.Text())
		if len(args) < 3 || args[0] != "ACL" || args[1] != "SETUSER" || args[2] != user {
			continue
		}

		for i, a := range args {
			args[i] = strings.ReplaceAll(a, "PASSWORD", password)
		}

		return args
	}

	t.Fatalf("README has no ACL SETUSER %s line", user)

	return nil
}

// grantACL creates README's data-node user on each server.
func grantACL(t *testing.T, servers ...*harness.Redis) {
	t.Helper()

	args := readmeACL(t, aclUser, aclPassword)

	for _, r := range servers {
		p := r.Client(redisresp.Options{})
		redisDo(t, p, args...)
		p.Close()
	}
}

// grantSentinelACL creates README's sentinel user on each sentinel.
func grantSentinelACL(t *testing.T, sentinels ...*harness.Redis) {
	t.Helper()

	args := readmeACL(t, aclSentinelUser, aclSentinelPassword)

	for _, r := range sentinels {
		p := r.Client(redisresp.Options{})
		redisDo(t, p, args...)
		p.Close()
	}
}

// TestRedisACLLine: README's ACL line is enough for fixed and sliding windows
// and routes in db 1: nothing falls back to memory, the counters are in db 1.
// (The TLS and Sentinel tests run as the same user.)
func TestRedisACLLine(t *testing.T) {
	r := startRedis(t)
	grantACL(t, r)

	e := start(t, `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(`+"`/`"+`)
      middlewares: [acl]
      service: backend
  middlewares:
    acl:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "`+r.Addr+`", db: 1, username: `+aclUser+`, password: `+aclPassword+`, timeout: 1s}
          global: {points: 1000, duration: 10s}
          ip: {points: 5, duration: 60s, algorithm: sliding}
          routes:
            - {name: login, paths: [/login], points: 3, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)
	e.waitRouters("api")

	count := func(path, client string, n int) int {
		allowed := 0

		for i := 0; i < n; i++ {
			switch resp := e.get(e.traefik.Web+path, from(client)); resp.code {
			case http.StatusOK:
				allowed++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("%s: %d %q", path, resp.code, resp.body)
			}
		}

		return allowed
	}

	if n := count("/api", "198.51.100.1", 8); n != 5 {
		t.Errorf("sliding ip layer allowed %d of 8, want 5", n)
	}

	if n := count("/login", "198.51.100.2", 6); n != 3 {
		t.Errorf("login route allowed %d of 6, want 3", n)
	}

	if logs := e.traefik.Logs(); strings.Contains(logs, "REDIS_UNAVAILABLE") {
		t.Fatalf("the ACL user fell back to memory:\n%s", grepLines(logs, "REDIS_"))
	}

	db1 := r.Client(redisresp.Options{DB: 1})
	defer db1.Close()

	prefix := "ratelimit:acl@file:"

	if v := redisDo(t, db1, "HGET", prefix+"ip:198.51.100.1", "c"); v.Str != "5" {
		t.Errorf("sliding counter in db 1: %q, want 5", v.String())
	}

	if v := redisDo(t, db1, "GET", prefix+"login:198.51.100.2"); v.Str != "3" {
		t.Errorf("route counter in db 1: %q, want 3 (a refused request is charged nothing)", v.String())
	}

	if v := redisDo(t, db1, "GET", prefix+"global:global"); v.Str != "8" {
		t.Errorf("global counter in db 1: %q, want 8 (the 5 + 3 allowed; a refused request is charged to no layer)", v.String())
	}

	db0 := r.Client(redisresp.Options{})
	defer db0.Close()

	if ks := keys(t, db0, prefix); len(ks) != 0 {
		t.Errorf("keys in db 0: %v", ks)
	}
}
