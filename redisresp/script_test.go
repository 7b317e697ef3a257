package redisresp

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const testScript = "return {KEYS[1], ARGV[1]}"

// scriptHandler imitates Redis's script cache: EVALSHA of an unknown SHA is
// NOSCRIPT, EVAL caches the source. A script "runs" by echoing its keys and
// arguments as an array of bulk strings; evalshaReply, when set, replaces
// every EVALSHA answer.
type scriptHandler struct {
	mu           sync.Mutex
	cache        map[string]string
	evalshaReply string
	evalReply    string
}

func newScriptHandler() *scriptHandler {
	return &scriptHandler{cache: map[string]string{}}
}

func (h *scriptHandler) handle(conn int, args []string) string {
	h.mu.Lock()
	defer h.mu.Unlock()

	switch args[0] {
	case "EVALSHA":
		if h.evalshaReply != "" {
			return h.evalshaReply
		}

		if len(args) < 3 {
			return "-ERR wrong number of arguments for 'evalsha' command\r\n"
		}

		if _, ok := h.cache[args[1]]; !ok {
			return "-NOSCRIPT No matching script. Please use EVAL.\r\n"
		}

		return runReply(args[2:])
	case "EVAL":
		if h.evalReply != "" {
			return h.evalReply
		}

		if len(args) < 3 {
			return "-ERR wrong number of arguments for 'eval' command\r\n"
		}

		sum := sha1.Sum([]byte(args[1]))
		h.cache[hex.EncodeToString(sum[:])] = args[1]

		return runReply(args[2:])
	default:
		return basicHandler(conn, args)
	}
}

// runReply answers numkeys, keys and args with the keys and args.
func runReply(rest []string) string {
	out := "*" + strconv.Itoa(len(rest)-1) + "\r\n"
	for _, a := range rest[1:] {
		out += bulk(a)
	}

	return out
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestScriptSHA(t *testing.T) {
	// Known value: redis-cli SCRIPT LOAD "return 1".
	if got := NewScript("return 1").sha; got != "e0e1f9fabfc9d4800c877a703b823ac0578ff8db" {
		t.Fatalf(`SHA of "return 1" = %s`, got)
	}

	for _, src := range []string{"", testScript, "return redis.call('GET', KEYS[1])\n"} {
		if got, want := NewScript(src).sha, sha1Hex(src); got != want {
			t.Fatalf("SHA of %q = %s, want %s", src, got, want)
		}
	}
}

func TestScriptRunFallsBackToEval(t *testing.T) {
	h := newScriptHandler()
	s := startServer(t, h.handle)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	sc := NewScript(testScript)
	sha := sc.sha

	keys, args := []string{"k1", "k2"}, []string{"a1", "a2", "a3"}

	check := func(v Value, err error) {
		t.Helper()

		if err != nil {
			t.Fatalf("Run: %v", err)
		}

		want := []string{"k1", "k2", "a1", "a2", "a3"}
		if v.Kind != KindArray || len(v.Array) != len(want) {
			t.Fatalf("Run = %#v, want the script's reply", v)
		}

		for i, w := range want {
			if v.Array[i].Str != w {
				t.Fatalf("Run = %#v, want the script's reply", v)
			}
		}
	}

	// Not cached yet: EVALSHA, NOSCRIPT, then EVAL.
	check(sc.Run(p, keys, args))

	// Cached by EVAL: EVALSHA alone.
	check(sc.Run(p, keys, args))

	want := [][]string{
		{"EVALSHA", sha, "2", "k1", "k2", "a1", "a2", "a3"},
		{"EVAL", testScript, "2", "k1", "k2", "a1", "a2", "a3"},
		{"EVALSHA", sha, "2", "k1", "k2", "a1", "a2", "a3"},
	}

	got := s.log()
	if len(got) != len(want) {
		t.Fatalf("server got %v, want %v", got, want)
	}

	for i := range want {
		if !sameArgs(got[i].args, want[i]) {
			t.Fatalf("command %d = %q, want %q", i, got[i].args, want[i])
		}
	}
}

func TestScriptRunNoKeysNoArgs(t *testing.T) {
	h := newScriptHandler()
	s := startServer(t, h.handle)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	sc := NewScript("return 1")

	v, err := sc.Run(p, nil, nil)
	if err != nil || v.Kind != KindArray || len(v.Array) != 0 {
		t.Fatalf("Run = %#v, %v", v, err)
	}

	got := s.log()
	if len(got) != 2 || !sameArgs(got[0].args, []string{"EVALSHA", sc.sha, "0"}) ||
		!sameArgs(got[1].args, []string{"EVAL", "return 1", "0"}) {
		t.Fatalf("server got %v", got)
	}
}

func TestScriptRunReturnsEvalReply(t *testing.T) {
	// The reply of the fallback EVAL is Run's reply, error values included.
	h := newScriptHandler()
	h.evalReply = "-ERR user_script:1: Script attempted to access nonexistent global variable 'x'\r\n"
	s := startServer(t, h.handle)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	v, err := NewScript("return x").Run(p, []string{"k"}, nil)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}

	if !v.IsError() || v.Str != "ERR user_script:1: Script attempted to access nonexistent global variable 'x'" {
		t.Fatalf("Run = %#v, want the EVAL error value", v)
	}

	if got := s.log(); len(got) != 2 || got[1].args[0] != "EVAL" {
		t.Fatalf("server got %v, want EVALSHA then EVAL", got)
	}
}

func TestScriptRunOtherErrorNoEval(t *testing.T) {
	cases := []struct {
		name  string
		reply string
		want  string
	}{
		{"plain error", "-ERR x\r\n", "ERR x"},
		{"busy", "-BUSY Redis is busy running a script.\r\n", "BUSY Redis is busy running a script."},
		{"noscript not first", "-ERR NOSCRIPT inside the text\r\n", "ERR NOSCRIPT inside the text"},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newScriptHandler()
			h.evalshaReply = tc.reply
			s := startServer(t, h.handle)

			p := NewPool(longOptions(s.addr()))
			defer p.Close()

			v, err := NewScript(testScript).Run(p, []string{"k"}, []string{"a"})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}

			if !v.IsError() || v.Str != tc.want {
				t.Fatalf("Run = %#v, want error value %q", v, tc.want)
			}

			got := s.log()
			if len(got) != 1 || got[0].args[0] != "EVALSHA" {
				t.Fatalf("server got %v, want EVALSHA alone", got)
			}
		})
	}
}

func TestScriptRunNonErrorReplyNoEval(t *testing.T) {
	// A reply that merely looks like NOSCRIPT but is not an error is a result.
	h := newScriptHandler()
	h.evalshaReply = "+NOSCRIPT\r\n"
	s := startServer(t, h.handle)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	v, err := NewScript(testScript).Run(p, nil, nil)
	if err != nil || v.Kind != KindSimple || v.Str != "NOSCRIPT" {
		t.Fatalf("Run = %#v, %v", v, err)
	}

	if got := s.log(); len(got) != 1 {
		t.Fatalf("server got %v, want EVALSHA alone", got)
	}
}

func TestScriptRunIOErrorNoEval(t *testing.T) {
	h := newScriptHandler()
	h.evalshaReply = closeConn
	s := startServer(t, h.handle)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	v, err := NewScript(testScript).Run(p, []string{"k"}, nil)
	if err == nil {
		t.Fatalf("Run = %#v, want an error", v)
	}

	// Run returned; an EVAL would have been answered, hence logged, before.
	if got := s.log(); len(got) != 1 || got[0].args[0] != "EVALSHA" {
		t.Fatalf("server got %v, want EVALSHA alone", got)
	}
}

func TestScriptRunClosedPool(t *testing.T) {
	s := startServer(t, newScriptHandler().handle)

	p := NewPool(longOptions(s.addr()))
	p.Close()

	if _, err := NewScript(testScript).Run(p, nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run on a closed pool: err = %v, want ErrClosed", err)
	}

	if n := s.acceptedCount(); n != 0 {
		t.Fatalf("closed pool opened %d connections", n)
	}
}

// TestScriptRunIntsSendsWhatRunSends: the pre-encoded path sends the same
// commands as Run, NOSCRIPT fallback included, and reads integer arrays.
func TestScriptRunIntsSendsWhatRunSends(t *testing.T) {
	s := startServer(t, func(_ int, args []string) string {
		if args[0] == "EVALSHA" {
			return "-NOSCRIPT No matching script. Please use EVAL.\r\n"
		}

		return "*3\r\n:1\r\n:-2\r\n:30000\r\n"
	})

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	sc := NewScript(testScript)

	ints, serverErr, err := sc.RunInts(p, 2, 5, Bulk("k1")+Bulk("k2")+Bulk("a1")+Bulk("")+Bulk("a\r\n3"))
	if err != nil || serverErr != "" || len(ints) != 3 || ints[0] != 1 || ints[1] != -2 || ints[2] != 30000 {
		t.Fatalf("RunInts: %v %q %v", ints, serverErr, err)
	}

	want := [][]string{
		{"EVALSHA", sc.sha, "2", "k1", "k2", "a1", "", "a\r\n3"},
		{"EVAL", testScript, "2", "k1", "k2", "a1", "", "a\r\n3"},
	}

	got := s.log()
	if len(got) != len(want) {
		t.Fatalf("server got %v, want %v", got, want)
	}

	for i := range want {
		if !sameArgs(got[i].args, want[i]) {
			t.Fatalf("command %d = %q, want %q", i, got[i].args, want[i])
		}
	}
}

func TestDoIntsRejectsOtherReplies(t *testing.T) {
	replies := map[string]string{
		"status":          "+OK\r\n",
		"bulk":            "$1\r\n1\r\n",
		"bulk in array":   "*2\r\n:1\r\n$1\r\n1\r\n",
		"nested":          "*1\r\n*0\r\n",
		"too long":        "*99999999\r\n",
		"negative length": "*-5\r\n",
		"bad integer":     "*1\r\n:x\r\n",
		"empty integer":   "*2\r\n:1\r\n:\r\n",
		"bare LF":         "*1\r\n:12\n",
		"short":           "*3\r\n:1\r\n:2\r\n",
		"overflow":        "*1\r\n:99999999999999999999\r\n",
		"long line":       "*1\r\n:" + strings.Repeat("1", 8192) + "\r\n",
	}

	wantErr := map[string]error{"bulk in array": ErrUnexpected, "empty integer": ErrProtocol, "bad integer": ErrProtocol,
		"bare LF": ErrProtocol, "overflow": ErrProtocol, "long line": ErrProtocol}

	for name, reply := range replies {
		s := startServer(t, func(int, []string) string { return reply })
		p := NewPool(longOptions(s.addr()))
		p.opts.Timeout = 300 * time.Millisecond

		ints, serverErr, err := p.DoInts("*1\r\n$4\r\nPING\r\n")
		if err == nil {
			t.Errorf("%s: accepted as %v %q", name, ints, serverErr)
		}

		if want := wantErr[name]; want != nil && !errors.Is(err, want) {
			t.Errorf("%s: error %v, want %v", name, err, want)
		}

		p.Close()
	}

	// A server error is a value, and the connection stays.
	s := startServer(t, func(int, []string) string { return "-ERR boom\r\n" })
	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	for i := 0; i < 2; i++ {
		if _, serverErr, err := p.DoInts("*1\r\n$4\r\nPING\r\n"); err != nil || serverErr != "ERR boom" {
			t.Fatalf("server error: %q %v", serverErr, err)
		}
	}

	if s.acceptedCount() != 1 {
		t.Fatalf("%d connections: a server error closed the connection", s.acceptedCount())
	}
}

func TestBulk(t *testing.T) {
	if got := Bulk("héllo"); got != "$6\r\nhéllo\r\n" {
		t.Fatalf("%q", got)
	}

	if got := Bulk(""); got != "$0\r\n\r\n" {
		t.Fatalf("%q", got)
	}
}

// scriptServer answers EVALSHA with NOSCRIPT until an EVAL of the script, then
// with reply; flush forgets the script, as SCRIPT FLUSH or a restart does.
type scriptServer struct {
	mu     sync.Mutex
	loaded bool
	reply  string
}

func (h *scriptServer) handle(_ int, args []string) string {
	h.mu.Lock()
	defer h.mu.Unlock()

	if args[0] == "EVAL" {
		h.loaded = true
	} else if !h.loaded {
		return "-NOSCRIPT No matching script. Please use EVAL.\r\n"
	}

	return h.reply
}

func (h *scriptServer) set(loaded bool, reply string) {
	h.mu.Lock()
	h.loaded, h.reply = loaded, reply
	h.mu.Unlock()
}

// TestPoolScript: Script loads the script on NOSCRIPT, on a new connection
// and on an idle one, reuses its connection, and reads replies of any length.
func TestPoolScript(t *testing.T) {
	h := &scriptServer{reply: "*4\r\n:1\r\n:2000\r\n:7\r\n:-3\r\n"}
	s := startServer(t, h.handle)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	sc := NewScript(testScript)
	call := sc.Call(1, 2)
	cmd := call.Head() + Bulk("k") + Bulk("a")

	for i := 0; i < 4; i++ {
		switch i {
		case 2:
			h.set(false, "*12\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n:7\r\n:8\r\n:9\r\n:10\r\n:11\r\n:-12\r\n")
		case 3:
			h.set(true, ":9007199254740993\r\n")
		}

		n, ints, err := ScriptInts(p, nil, call, cmd)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}

		if want := []int64{1, 2000, 7, -3}; i < 2 && (n != -1 || fmt.Sprint(ints) != fmt.Sprint(want)) {
			t.Fatalf("call %d: %d %v, want %v", i, n, ints, want)
		}

		if i == 2 && (len(ints) != 12 || ints[9] != 10 || ints[11] != -12) {
			t.Fatalf("call %d: %v", i, ints)
		}

		if i == 3 && (ints != nil || n != 9007199254740993) {
			t.Fatalf("call %d: %d %v", i, n, ints)
		}
	}

	var names []string
	for _, c := range s.log() {
		names = append(names, c.args[0])

		if c.conn != 1 || !sameArgs(c.args[1:], []string{c.args[1], "1", "k", "a"}) {
			t.Fatalf("command %q on connection %d", c.args, c.conn)
		}
	}

	if got := strings.Join(names, " "); got != "EVALSHA EVAL EVALSHA EVALSHA EVAL EVALSHA" {
		t.Fatalf("commands %s, want EVALSHA EVAL EVALSHA EVALSHA EVAL EVALSHA", got)
	}
}

// TestPoolScriptFailures: an error reply is ErrServer and keeps the
// connection; any other reply is an error that closes it.
func TestPoolScriptFailures(t *testing.T) {
	const good = "*2\r\n:1\r\n:2\r\n"

	h := &scriptServer{}
	s := startServer(t, h.handle)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	call := NewScript(testScript).Call(1, 1)
	conns := 1

	for _, tc := range []struct {
		reply string
		want  error
		keep  bool
	}{
		{"-ERR boom\r\n", ErrServer, true},
		{"*2\r\n:1\r\n$1\r\n2\r\n", ErrUnexpected, false},
		{"*1\r\n:x\r\n", ErrProtocol, false},
		{":x\r\n", ErrProtocol, false},
		{":\r\n", ErrUnexpected, false},
		{":-3\r\n", ErrUnexpected, false},
		{"*2\r\n:1\r\n:2\n", ErrProtocol, false},
		{"+OK\r\n", ErrUnexpected, false},
		{"*99999999\r\n", ErrUnexpected, false},
		{"*1\r\n:" + strings.Repeat("1", 8192) + "\r\n", ErrProtocol, false},
	} {
		h.set(true, good)

		if _, _, err := ScriptInts(p, nil, call, call.Head()+Bulk("k")); err != nil {
			t.Fatalf("good reply: %v", err)
		}

		h.set(true, tc.reply)

		n, ints, err := ScriptInts(p, nil, call, call.Head()+Bulk("k"))
		if !errors.Is(err, tc.want) {
			t.Fatalf("%q: %d %v %v, want %v", tc.reply, n, ints, err, tc.want)
		}

		if !tc.keep {
			conns++
		}

		h.set(true, good)

		if _, _, err := ScriptInts(p, nil, call, call.Head()+Bulk("k")); err != nil || s.acceptedCount() != conns {
			t.Fatalf("after %q: %v, %d connections, want %d", tc.reply, err, s.acceptedCount(), conns)
		}
	}
}
