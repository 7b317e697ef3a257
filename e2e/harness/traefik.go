// Package harness runs the plugin inside a real Traefik binary: it builds
// Traefik v3.6.12 from the Go module proxy once, lays the plugin out under
// plugins-local, and starts Traefik with a file-provider dynamic configuration.
package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// TraefikVersion is the Traefik release the tests run; e2e/go.mod pins the same.
const TraefikVersion = "v3.6.12"

// ModuleName is the plugin's module path, as Traefik's localPlugins names it.
const ModuleName = "github.com/tierlimit/tierlimit"

// E2EDir returns the e2e module's directory.
func E2EDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// RepoRoot returns the plugin repository's root.
func RepoRoot() string {
	return filepath.Dir(E2EDir())
}

// TraefikBinary returns the path of the Traefik binary, building it into the
// git-ignored e2e/.cache on first use (a few minutes on a cold module cache).
func TraefikBinary(log io.Writer) (string, error) {
	bin := filepath.Join(E2EDir(), ".cache", "traefik-"+TraefikVersion)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}

	if log != nil {
		fmt.Fprintf(log, "building Traefik %s from the Go module proxy into %s (first run only)\n", TraefikVersion, bin)
	}

	tmp := bin + ".tmp"
	cmd := exec.Command("go", "build", "-o", tmp, "github.com/traefik/traefik/v3/cmd/traefik")
	cmd.Dir = E2EDir()
	cmd.Stdout = log
	cmd.Stderr = log

	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building traefik: %w", err)
	}

	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("installing traefik binary: %w", err)
	}

	return bin, nil
}

// CopyPlugin lays the plugin's source out as Traefik's local plugin loader
// expects it: <goPath>/src/<module>/. Only what the catalog would ship goes:
// the manifest, go.mod, vendor/ and non-test Go files of the module's packages.
func CopyPlugin(goPath string) error {
	return CopyPluginFrom(RepoRoot(), goPath)
}

// CopyPluginFrom is CopyPlugin for the plugin's source at src (another
// version of it: loadbench's -baseline).
func CopyPluginFrom(src, goPath string) error {
	dst := filepath.Join(goPath, "src", filepath.FromSlash(ModuleName))

	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}

		rel, _ := filepath.Rel(src, path)

		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || rel == "e2e" || rel == "examples") {
				return filepath.SkipDir
			}

			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}

		keep := rel == ".traefik.yml" || rel == "go.mod" || rel == "go.sum" ||
			strings.HasPrefix(rel, "vendor"+string(filepath.Separator)) ||
			(strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go"))
		if !keep {
			return nil
		}

		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}

		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()

	return l.Addr().(*net.TCPAddr).Port, nil
}

// Traefik is a running Traefik process.
type Traefik struct {
	Dir         string // working directory, holding plugins-local/
	DynamicPath string
	Web         string // base URL of the "web" entrypoint (forwardedHeaders trusted from 127.0.0.1)
	Insecure    string // base URL of the "insecure" entrypoint (forwardedHeaders.insecure)
	Raw         string // base URL of the "raw" entrypoint: as "web", with http.sanitizePath false
	API         string // base URL of the API and ping entrypoint

	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
}

// Options configures Start.
type Options struct {
	Dir     string // a fresh directory to run in
	Dynamic string // the dynamic configuration (YAML)
	// Extra is appended to the static configuration (YAML, top level).
	Extra string
	// Stdout, when set, also receives Traefik's output.
	Stdout io.Writer
	// BuildLog, when set, receives the output of building Traefik (first run only).
	BuildLog io.Writer
	// Plugins are more local plugins to load beside tierlimit (e.g. a baseline).
	Plugins []LocalPlugin
	// Debug turns on api.debug: Go's pprof under <API>/debug/pprof/.
	Debug bool
	// ProvidersThrottle is providers.providersThrottleDuration; empty keeps
	// Traefik's default (2s), which holds back reloads written in a row.
	ProvidersThrottle string
	// PluginSource is the tierlimit source tree to load; empty: this
	// repository's working tree.
	PluginSource string
	// Providers is more of the static configuration's providers section
	// (YAML, each line indented by two spaces), beside the file provider.
	Providers string
}

// LocalPlugin is a plugin given by its source files, loaded in local mode under Alias.
type LocalPlugin struct {
	Alias  string
	Module string
	Files  map[string]string // file name -> content, .traefik.yml included
}

// Write lays the plugin out under goPath/src/<module>.
func (lp LocalPlugin) Write(goPath string) error {
	dir := filepath.Join(goPath, "src", filepath.FromSlash(lp.Module))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	for name, content := range lp.Files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}

	return nil
}

// Start runs Traefik with the plugin in local mode and waits until it answers ping.
//
// Ports are picked free just before Traefik starts; an outgoing connection may
// take one in between (loopback ephemeral ports come from the same range), so
// a start that fails to bind is retried with new ports.
func Start(opts Options) (*Traefik, error) {
	var err error

	for attempt := 0; attempt < 5; attempt++ {
		var tr *Traefik

		tr, err = start(opts)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			return tr, err
		}
	}

	return nil, err
}

func start(opts Options) (*Traefik, error) {
	bin, err := TraefikBinary(opts.BuildLog)
	if err != nil {
		return nil, err
	}

	src := opts.PluginSource
	if src == "" {
		src = RepoRoot()
	}

	if err := CopyPluginFrom(src, filepath.Join(opts.Dir, "plugins-local")); err != nil {
		return nil, fmt.Errorf("copying plugin: %w", err)
	}

	extra := ""

	for _, lp := range opts.Plugins {
		if err := lp.Write(filepath.Join(opts.Dir, "plugins-local")); err != nil {
			return nil, fmt.Errorf("writing plugin %s: %w", lp.Module, err)
		}

		extra += fmt.Sprintf("    %s:\n      moduleName: %s\n", lp.Alias, lp.Module)
	}

	ports := make([]int, 4)
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return nil, err
		}
	}

	tr := &Traefik{
		Dir:         opts.Dir,
		DynamicPath: filepath.Join(opts.Dir, "dynamic", "dynamic.yml"),
		Web:         fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		Insecure:    fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		API:         fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		Raw:         fmt.Sprintf("http://127.0.0.1:%d", ports[3]),
		logs:        &syncBuffer{},
		done:        make(chan struct{}),
	}

	if err := os.MkdirAll(filepath.Dir(tr.DynamicPath), 0o755); err != nil {
		return nil, err
	}

	if err := tr.WriteDynamic(opts.Dynamic); err != nil {
		return nil, err
	}

	throttle := ""
	if opts.ProvidersThrottle != "" {
		throttle = "  providersThrottleDuration: " + opts.ProvidersThrottle + "\n"
	}

	static := fmt.Sprintf(`entryPoints:
  web:
    address: 127.0.0.1:%d
    forwardedHeaders:
      trustedIPs: ["127.0.0.1/32"]
  insecure:
    address: 127.0.0.1:%d
    forwardedHeaders:
      insecure: true
  traefik:
    address: 127.0.0.1:%d
  raw:
    address: 127.0.0.1:%d
    forwardedHeaders:
      trustedIPs: ["127.0.0.1/32"]
    http:
      sanitizePath: false
api:
  insecure: true
  debug: %t
ping: {}
log:
  level: INFO
providers:
%s%s  file:
    filename: %q
    watch: true
experimental:
  localPlugins:
    tierlimit:
      moduleName: %s
%s%s`, ports[0], ports[1], ports[2], ports[3], opts.Debug, throttle, opts.Providers, tr.DynamicPath, ModuleName, extra, opts.Extra)

	staticPath := filepath.Join(opts.Dir, "traefik.yml")
	if err := os.WriteFile(staticPath, []byte(static), 0o644); err != nil {
		return nil, err
	}

	var out io.Writer = tr.logs
	if opts.Stdout != nil {
		out = io.MultiWriter(tr.logs, opts.Stdout)
	}

	if err := tr.run(bin, staticPath, out); err != nil {
		return nil, err
	}

	if err := tr.waitPing(60 * time.Second); err != nil {
		tr.Stop()
		return nil, fmt.Errorf("%w\ntraefik output:\n%s", err, tr.Logs())
	}

	return tr, nil
}

// run starts the Traefik binary bin with the static configuration file
// staticPath in tr.Dir, its output to out.
func (tr *Traefik) run(bin, staticPath string, out io.Writer) error {
	tr.cmd = exec.Command(bin, "--configFile="+staticPath)
	tr.cmd.Dir = tr.Dir
	tr.cmd.Stdout = out
	tr.cmd.Stderr = out
	tr.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	if err := tr.cmd.Start(); err != nil {
		return fmt.Errorf("starting traefik: %w", err)
	}

	go func() {
		_ = tr.cmd.Wait()
		close(tr.done)
	}()

	return nil
}

// StartAsWritten runs Traefik in dir as `traefik --configFile=traefik.yml`
// there: the static configuration dir/traefik.yml and the files it names
// (a file provider's, relative to dir) are the caller's, and nothing is
// added to them; the plugin is laid out under dir/plugins-local, where a
// localPlugins section finds it. It returns once the process has started:
// the configuration may have no API or ping to wait on, so the caller waits
// for its entrypoints to serve (Traefik.Exited tells a process that ended).
func StartAsWritten(dir string) (*Traefik, error) {
	bin, err := TraefikBinary(nil)
	if err != nil {
		return nil, err
	}

	if err := CopyPlugin(filepath.Join(dir, "plugins-local")); err != nil {
		return nil, fmt.Errorf("copying plugin: %w", err)
	}

	tr := &Traefik{Dir: dir, logs: &syncBuffer{}, done: make(chan struct{})}
	if err := tr.run(bin, "traefik.yml", tr.logs); err != nil {
		return nil, err
	}

	return tr, nil
}

// Exited reports whether the Traefik process has ended.
func (tr *Traefik) Exited() bool {
	select {
	case <-tr.done:
		return true
	default:
		return false
	}
}

func (tr *Traefik) waitPing(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	client := &http.Client{Timeout: time.Second}

	for time.Now().Before(deadline) {
		select {
		case <-tr.done:
			return errors.New("traefik exited")
		default:
		}

		resp, err := client.Get(tr.API + "/ping")
		if err == nil {
			resp.Body.Close()

			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}

		time.Sleep(50 * time.Millisecond)
	}

	return errors.New("traefik did not answer ping")
}

// WriteDynamic replaces the dynamic configuration; Traefik reloads it.
func (tr *Traefik) WriteDynamic(content string) error {
	return os.WriteFile(tr.DynamicPath, []byte(content), 0o644)
}

// RouterState is a router as Traefik's API reports it.
type RouterState struct {
	Name   string   `json:"name"`
	Status string   `json:"status"`
	Error  []string `json:"error"`
}

// WaitRouters waits until every named router (without provider suffix) is
// reported by the API, and returns their states. A router whose middleware
// failed to build is reported with status "disabled" and its error.
func (tr *Traefik) WaitRouters(limit time.Duration, names ...string) (map[string]RouterState, error) {
	deadline := time.Now().Add(limit)

	for {
		states, err := tr.routers()
		if err == nil {
			all := true

			for _, n := range names {
				if _, ok := states[n]; !ok {
					all = false
				}
			}

			if all {
				return states, nil
			}
		}

		if time.Now().After(deadline) {
			return states, fmt.Errorf("routers %v not reported within %s (last error: %v)", names, limit, err)
		}

		time.Sleep(50 * time.Millisecond)
	}
}

func (tr *Traefik) routers() (map[string]RouterState, error) {
	// A bounded request, so that WaitRouters keeps to its deadline.
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(tr.API + "/api/http/routers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()

	var list []RouterState
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}

	states := make(map[string]RouterState, len(list))
	for _, r := range list {
		states[strings.TrimSuffix(r.Name, "@file")] = r
	}

	return states, nil
}

// Logs returns everything Traefik has printed so far.
func (tr *Traefik) Logs() string {
	return tr.logs.String()
}

// Kill stops Traefik abruptly (SIGKILL), as a crash would, and waits for it.
func (tr *Traefik) Kill() {
	if tr.cmd == nil || tr.cmd.Process == nil {
		return
	}

	_ = tr.cmd.Process.Kill()
	<-tr.done
}

// Stop terminates Traefik and waits for it.
func (tr *Traefik) Stop() {
	if tr.cmd == nil || tr.cmd.Process == nil {
		return
	}

	_ = tr.cmd.Process.Signal(syscall.SIGTERM)

	select {
	case <-tr.done:
	case <-time.After(10 * time.Second):
		_ = tr.cmd.Process.Kill()
		<-tr.done
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()

	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()

	return b.buf.String()
}

// Passthrough is a baseline plugin: it sets one header and calls next.
// It shows what any Yaegi plugin costs, whatever it does.
var Passthrough = LocalPlugin{
	Alias:  "passthrough",
	Module: "example.com/passthrough",
	Files: map[string]string{
		".traefik.yml": "displayName: passthrough\ntype: middleware\nimport: example.com/passthrough\nsummary: baseline\ntestData: {}\n",
		"go.mod":       "module example.com/passthrough\n\ngo 1.22\n",
		"passthrough.go": `package passthrough

import (
	"context"
	"net/http"
)

type Config struct{}

func CreateConfig() *Config { return &Config{} }

type handler struct{ next http.Handler }

func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	return &handler{next: next}, nil
}

func (h *handler) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	rw.Header().Set("X-Passthrough", "1")
	h.next.ServeHTTP(rw, req)
}
`,
	},
}

// MinimalLimiter is the least a plugin can do and still meet the README's
// contract for the common case: key by the peer's address, one fixed window
// per key under a mutex, the clock, the five rate-limit headers, and a
// refusal as the design answers it (429, Retry-After, no-store, the JSON
// body). It stands for the floor of any Yaegi rate limiter in the benchmarks;
// it is not this plugin.
var MinimalLimiter = LocalPlugin{
	Alias:  "minimal",
	Module: "example.com/minimal",
	Files: map[string]string{
		".traefik.yml": "displayName: minimal\ntype: middleware\nimport: example.com/minimal\nsummary: baseline\ntestData: {}\n",
		"go.mod":       "module example.com/minimal\n\ngo 1.22\n",
		"minimal.go": `package minimal

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

type Config struct {
	Points  int64
	Seconds int64
}

func CreateConfig() *Config { return &Config{Points: 100000000, Seconds: 1} }

type window struct {
	count, reset int64
}

type handler struct {
	next     http.Handler
	points   int64
	duration int64
	mu       sync.Mutex
	m        map[string]*window
	limit    []string
	policy   []string
	json     []string
	noStore  []string
}

func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	limit := strconv.FormatInt(config.Points, 10)
	return &handler{next: next, points: config.Points, duration: config.Seconds * 1e9, m: map[string]*window{},
		limit: []string{limit}, policy: []string{"\"ip\";q=" + limit + ";w=" + strconv.FormatInt(config.Seconds, 10)},
		json: []string{"application/json"}, noStore: []string{"no-store"}}, nil
}

func (h *handler) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	key := req.Header.Get("X-Forwarded-For")
	if key == "" {
		key = req.RemoteAddr[:strings.LastIndexByte(req.RemoteAddr, ':')]
	}
	now := time.Now().UnixNano()
	h.mu.Lock()
	w := h.m[key]
	if w == nil || w.reset <= now {
		w = &window{reset: now + h.duration}
		h.m[key] = w
	}
	w.count++
	count, reset := w.count, w.reset
	h.mu.Unlock()
	left := "0"
	if count < h.points {
		left = strconv.FormatInt(h.points-count, 10)
	}
	secs := strconv.FormatInt((reset-now+999999999)/1e9, 10)
	hd := rw.Header()
	hd["X-Ratelimit-Limit"] = h.limit
	hd["X-Ratelimit-Remaining"] = []string{left}
	hd["X-Ratelimit-Reset"] = []string{strconv.FormatInt((reset+999999999)/1e9, 10)}
	hd["Ratelimit-Policy"] = h.policy
	hd["Ratelimit"] = []string{"\"ip\";r=" + left + ";t=" + secs}
	if count > h.points {
		hd["Retry-After"] = []string{secs}
		hd["Content-Type"] = h.json
		hd["Cache-Control"] = h.noStore
		rw.WriteHeader(http.StatusTooManyRequests)
		rw.Write([]byte("{\"errors\":[{\"message\":\"Hit rate limit\",\"extensions\":{\"code\":\"REQUESTS_EXCEEDED\",\"limit\":" +
			h.limit[0] + ",\"reset\":\"" + time.Unix((reset+999999999)/1e9, 0).UTC().Format(time.RFC3339) + "\",\"layer\":\"ip\"}}]}"))
		return
	}
	h.next.ServeHTTP(rw, req)
}
`,
	},
}
