package redisstore

import (
	"bufio"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// startRedis runs a redis-server of the test's own on a free loopback
// port, persisting nothing, and returns its address and a client for checks
// (both stopped at the test's end): the root's redisServer, without its ACL
// user. The scripts' Lua (5.1, with Redis's number conversions) is only
// exercised for real there.
func startRedis(t *testing.T) (string, *redisresp.Pool) {
	t.Helper()

	return startRedisServer(t, func(string) []string { return nil })
}

// startRedisServer is startRedis with the arguments args gives for its port.
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

// redisDo runs a command on the test's server.
func redisDo(t *testing.T, p *redisresp.Pool, args ...string) redisresp.Value {
	t.Helper()

	v, err := p.Do(args...)
	if err != nil || v.IsError() {
		t.Fatalf("redis %v: %+v %v", args, v, err)
	}

	return v
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	addr := l.Addr().String()
	l.Close()

	return addr
}

// cannedRedis answers every command with reply (raw RESP) and counts commands.
type cannedRedis struct {
	l        net.Listener
	mu       sync.Mutex
	reply    string
	commands atomic.Int64
}

func newCannedRedis(t *testing.T, reply string) *cannedRedis {
	t.Helper()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	s := &cannedRedis{l: l, reply: reply}
	t.Cleanup(func() { l.Close() })

	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}

			go s.serve(c)
		}
	}()

	return s
}

func (s *cannedRedis) serve(c net.Conn) {
	defer c.Close()

	br := bufio.NewReader(c)

	for {
		// A command is an array of bulk strings.
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}

		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))

		for i := 0; i < n; i++ {
			hdr, err := br.ReadString('\n')
			if err != nil {
				return
			}

			size, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
			if _, err := io.ReadFull(br, make([]byte, size+2)); err != nil {
				return
			}
		}

		s.commands.Add(1)
		s.mu.Lock()
		reply := s.reply
		s.mu.Unlock()

		if _, err := c.Write([]byte(reply)); err != nil {
			return
		}
	}
}

// clusterNode is a redis-server in cluster mode that holds every slot: a
// Cluster of one node.
func clusterNode(t *testing.T) (string, *redisresp.Pool) {
	t.Helper()

	dir := t.TempDir()
	addr, admin := startRedisServer(t, func(port string) []string {
		return []string{"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + port + ".conf",
			"--cluster-announce-ip", "127.0.0.1"}
	})

	redisDo(t, admin, "CLUSTER", "ADDSLOTSRANGE", "0", "16383")

	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(redisDo(t, admin, "CLUSTER", "INFO").Str, "cluster_state:ok"); {
		if time.Now().After(deadline) {
			t.Fatal("the cluster's state is not ok after 10s")
		}

		time.Sleep(10 * time.Millisecond)
	}

	return addr, admin
}
