package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// Redis is a real redis-server (Debian's package) on a loopback port.
type Redis struct {
	Addr string
	Port int
	dir  string
	args []string
	cmd  *exec.Cmd
	done chan struct{}

	// TLS, when set, serves TLS only on Port (plain port off); the harness
	// connects with these options.
	TLS *redisresp.TLSOptions
	// conf, when set, runs a sentinel with this configuration file.
	conf string
	// AdminUser and AdminPassword, when set, are the credentials Client uses
	// when given none (the default user may be restricted).
	AdminUser, AdminPassword string
}

// StartRestrictedRedis runs redis-server with its default user restricted
// to acl (ACL SETUSER rules, e.g. on nopass ~ratelimit:* -@all +evalsha), so
// that a client sending no credentials gets exactly those rights, and an
// admin user with every right for Client.
func StartRestrictedRedis(dir string, acl []string) (*Redis, error) {
	const admin, password = "harness-admin", "harness-admin-pw"

	// One argument per rule: redis-server reads "--user" and the words up to
	// the next option as one config line.
	args := append(append([]string{"--user", "default", "reset"}, acl...),
		"--user", admin, "on", ">"+password, "~*", "&*", "+@all")

	r, err := startRedis(dir, nil, args, admin, password)
	if err != nil {
		return nil, err
	}

	return r, nil
}

// StartSentinel runs redis-server as a sentinel watching the primary at
// primaryAddr as group name, with quorum 2 and failover timings short enough
// for tests (down after 1s).
func StartSentinel(dir, name, primaryAddr string) (*Redis, error) {
	host, port, _ := strings.Cut(primaryAddr, ":")
	conf := filepath.Join(dir, "sentinel.conf")
	text := "sentinel monitor " + name + " " + host + " " + port + " 2\n" +
		"sentinel down-after-milliseconds " + name + " 1000\n" +
		"sentinel failover-timeout " + name + " 5000\n" +
		"sentinel parallel-syncs " + name + " 1\n"

	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return nil, err
	}

	var err error

	for attempt := 0; attempt < 5; attempt++ {
		var p int

		if p, err = FreePort(); err != nil {
			return nil, err
		}

		r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(p), Port: p, dir: dir, conf: conf}
		if err = r.Start(); err == nil {
			return r, nil
		}

		if !strings.Contains(err.Error(), "Address already in use") {
			return nil, err
		}
	}

	return nil, err
}

// StartRedis runs redis-server on a free loopback port with persistence off;
// extra arguments (e.g. "--requirepass", "secret") are appended.
// The port is picked free just before the server starts; if something takes
// it in between, the start is retried on another.
func StartRedis(dir string, extra ...string) (*Redis, error) {
	return startRedis(dir, nil, extra, "", "")
}

// StartTLSRedis runs redis-server with TLS only, its certificate signed by
// ca; with authClients it requires a client certificate from ca.
func StartTLSRedis(dir string, ca *CA, authClients bool, extra ...string) (*Redis, error) {
	auth := "no"
	if authClients {
		auth = "yes"
	}

	args := append([]string{"--tls-cert-file", ca.ServerCert, "--tls-key-file", ca.ServerKey,
		"--tls-ca-cert-file", ca.CAFile, "--tls-auth-clients", auth}, extra...)
	opts := &redisresp.TLSOptions{CA: ca.CAPEM, Cert: ca.ClientCertPEM, Key: ca.ClientKeyPEM}

	return startRedis(dir, opts, args, "", "")
}

func startRedis(dir string, tlsOpts *redisresp.TLSOptions, extra []string, adminUser, adminPassword string) (*Redis, error) {
	var err error

	for attempt := 0; attempt < 5; attempt++ {
		var port int

		if port, err = FreePort(); err != nil {
			return nil, err
		}

		r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir, args: extra, TLS: tlsOpts,
			AdminUser: adminUser, AdminPassword: adminPassword}
		if err = r.Start(); err == nil {
			return r, nil
		}

		if !strings.Contains(err.Error(), "Address already in use") {
			return nil, err
		}
	}

	return nil, err
}

// Start starts (or restarts) the server on its port.
func (r *Redis) Start() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redis-server is not installed (apt-get install redis-server): %w", err)
	}

	ports := []string{"--port", strconv.Itoa(r.Port)}
	if r.TLS != nil {
		ports = []string{"--port", "0", "--tls-port", strconv.Itoa(r.Port)}
	}

	args := append(append(ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", r.dir, "--logfile", filepath.Join(r.dir, "redis.log")), r.args...)

	if r.conf != "" {
		args = []string{r.conf, "--sentinel", "--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
			"--dir", r.dir, "--logfile", filepath.Join(r.dir, "redis.log")}
	}

	r.cmd = exec.Command(bin, args...)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r.done = make(chan struct{})

	if err := r.cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}

	go func() {
		_ = r.cmd.Wait()
		close(r.done)
	}()

	deadline := time.Now().Add(10 * time.Second)

	for time.Now().Before(deadline) {
		select {
		case <-r.done:
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			return fmt.Errorf("redis-server exited:\n%s", log)
		default:
		}

		p := r.Client(redisresp.Options{Timeout: time.Second, PoolSize: 1})
		v, err := p.Do("PING")
		p.Close()

		// NOAUTH means it is up but wants a password.
		if err == nil && (v.Str == "PONG" || v.IsError()) {
			return nil
		}

		time.Sleep(20 * time.Millisecond)
	}

	r.Kill()

	return errors.New("redis-server did not answer PING")
}

// Kill stops the server abruptly (SIGKILL), as a crash would.
func (r *Redis) Kill() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}

	_ = r.cmd.Process.Kill()
	<-r.done
}

// Pause stops the server's process (SIGSTOP) without closing its
// connections: it answers nothing, as a frozen host would, until Resume.
func (r *Redis) Pause() error {
	return r.cmd.Process.Signal(syscall.SIGSTOP)
}

// Resume lets a paused server run again (SIGCONT).
func (r *Redis) Resume() error {
	return r.cmd.Process.Signal(syscall.SIGCONT)
}

// Client returns a pool for inspecting the server; opts.Address is set.
func (r *Redis) Client(opts redisresp.Options) *redisresp.Pool {
	opts.Address = r.Addr
	if opts.Username == "" && opts.Password == "" {
		opts.Username, opts.Password = r.AdminUser, r.AdminPassword
	}

	if r.TLS != nil {
		opts.TLS, opts.TLSConfig = true, *r.TLS
	}

	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}

	return redisresp.NewPool(opts)
}
