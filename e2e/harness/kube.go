package harness

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"
)

// The Kubernetes API server the e2e tests run Traefik's kubernetesCRD and
// kubernetesGateway providers against: kube-apiserver built from the Go module
// proxy (e2e/kube/apiserver pins it), storing in kine on SQLite.
const (
	KubeVersion = "v1.34.4"
	KineVersion = "v0.17.5"
)

// KubeAPIServerBinary returns the path of kube-apiserver, building it into
// e2e/.cache on first use (several minutes: `make kube` does it before the tests).
func KubeAPIServerBinary(log io.Writer) (string, error) {
	bin := filepath.Join(E2EDir(), ".cache", "kube-apiserver-"+KubeVersion)

	return cachedBuild(log, bin, filepath.Join(E2EDir(), "kube", "apiserver"), nil,
		"build", "-o", bin+".tmp", "k8s.io/kubernetes/cmd/kube-apiserver")
}

// KineBinary returns the path of kine (etcd's API on SQLite), building it into
// e2e/.cache on first use (cgo: gcc, which `go test -race` needs anyway).
func KineBinary(log io.Writer) (string, error) {
	bin := filepath.Join(E2EDir(), ".cache", "kine-"+KineVersion)
	gobin := bin + ".tmpdir"

	path, err := cachedBuild(log, bin, E2EDir(), []string{"GOBIN=" + gobin, "CGO_ENABLED=1"},
		"install", "github.com/k3s-io/kine@"+KineVersion)
	os.RemoveAll(gobin)

	return path, err
}

// cachedBuild runs go args in dir unless bin exists, then moves what it built
// (bin.tmp, or the one file of bin.tmpdir) to bin.
func cachedBuild(log io.Writer, bin, dir string, env []string, args ...string) (string, error) {
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}

	if log != nil {
		fmt.Fprintf(log, "building %s from the Go module proxy (first run only, minutes)\n", filepath.Base(bin))
	}

	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}

	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = log
	cmd.Stderr = log

	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s: %w", filepath.Base(bin), err)
	}

	built := bin + ".tmp"
	if entries, err := os.ReadDir(bin + ".tmpdir"); err == nil && len(entries) == 1 {
		built = filepath.Join(bin+".tmpdir", entries[0].Name())
	}

	if err := os.Rename(built, bin); err != nil {
		return "", fmt.Errorf("installing %s: %w", filepath.Base(bin), err)
	}

	return bin, nil
}

// Kube is a running kube-apiserver on kine, on loopback ports.
type Kube struct {
	URL    string // https://127.0.0.1:<port>
	Token  string // a bearer token of group system:masters
	CAFile string // the API server's self-signed certificate

	client *http.Client
	procs  []*exec.Cmd
	dones  []chan struct{}
	logs   *syncBuffer
}

// StartKube runs kine and kube-apiserver in dir and waits until /readyz answers ok.
func StartKube(dir string) (*Kube, error) {
	kineBin, err := KineBinary(os.Stderr)
	if err != nil {
		return nil, err
	}

	apiBin, err := KubeAPIServerBinary(os.Stderr)
	if err != nil {
		return nil, err
	}

	k := &Kube{Token: "tierlimit-e2e-token", CAFile: filepath.Join(dir, "certs", "apiserver.crt"), logs: &syncBuffer{}}

	kinePort, err := FreePort()
	if err != nil {
		return nil, err
	}

	if err := k.run(kineBin, "--endpoint", "sqlite://"+filepath.Join(dir, "state.db"),
		"--listen-address", "127.0.0.1:"+strconv.Itoa(kinePort)); err != nil {
		return nil, err
	}

	if err := waitTCP("127.0.0.1:"+strconv.Itoa(kinePort), 30*time.Second); err != nil {
		k.Stop()
		return nil, fmt.Errorf("kine: %w\n%s", err, k.Logs())
	}

	if err := k.startAPIServer(dir, apiBin, kinePort); err != nil {
		k.Stop()
		return nil, err
	}

	return k, nil
}

func (k *Kube) startAPIServer(dir, bin string, kinePort int) error {
	keyFile, pubFile := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writeRSAKey(keyFile, pubFile); err != nil {
		return err
	}

	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(k.Token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return err
	}

	port, err := FreePort()
	if err != nil {
		return err
	}

	k.URL = "https://127.0.0.1:" + strconv.Itoa(port)

	err = k.run(bin, "--etcd-servers=http://127.0.0.1:"+strconv.Itoa(kinePort),
		"--secure-port="+strconv.Itoa(port), "--bind-address=127.0.0.1",
		"--cert-dir="+filepath.Dir(k.CAFile), "--token-auth-file="+tokens,
		"--authorization-mode=AlwaysAllow",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pubFile, "--service-account-signing-key-file="+keyFile,
		"--service-cluster-ip-range=10.96.0.0/24", "--disable-admission-plugins=ServiceAccount")
	if err != nil {
		return err
	}

	// The certificate is written at start: skip verification until /readyz,
	// then pin it for every later request.
	k.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // until the cert exists
	}}

	if err := k.waitReady(90 * time.Second); err != nil {
		return fmt.Errorf("kube-apiserver: %w\n%s", err, tailLines(k.Logs(), 40))
	}

	pemBytes, err := os.ReadFile(k.CAFile)
	if err != nil {
		return err
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	k.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	return nil
}

func (k *Kube) run(bin string, args ...string) error {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = k.logs
	cmd.Stderr = k.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", filepath.Base(bin), err)
	}

	done := make(chan struct{})

	go func() {
		_ = cmd.Wait()
		close(done)
	}()

	k.procs = append(k.procs, cmd)
	k.dones = append(k.dones, done)

	return nil
}

func (k *Kube) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)

	for time.Now().Before(deadline) {
		for _, done := range k.dones {
			select {
			case <-done:
				return errors.New("a process exited")
			default:
			}
		}

		code, body, err := k.Do(http.MethodGet, "/readyz", "", nil)
		if err == nil && code == http.StatusOK && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}

		time.Sleep(200 * time.Millisecond)
	}

	return errors.New("/readyz did not answer ok")
}

// Stop kills the API server and kine (the API server takes seconds to stop
// on SIGTERM; nothing of its state outlives the test).
func (k *Kube) Stop() {
	for i := len(k.procs) - 1; i >= 0; i-- {
		_ = k.procs[i].Process.Kill()
		<-k.dones[i]
	}

	k.procs, k.dones = nil, nil
}

// Logs returns what kine and the API server printed.
func (k *Kube) Logs() string {
	return k.logs.String()
}

// Do sends a request to the API server with the token; contentType may be empty.
func (k *Kube) Do(method, path, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, k.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}

	req.Header.Set("Authorization", "Bearer "+k.Token)
	req.Header.Set("Accept", "application/json")

	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}

	resp, err := k.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()

	out, err := io.ReadAll(resp.Body)

	return resp.StatusCode, out, err
}

// kinds maps apiVersion/kind to the resource's plural name and whether it is namespaced:
// what the tests apply (Kubernetes, Traefik's CRDs and Gateway API).
var kinds = map[string]struct {
	plural     string
	namespaced bool
}{
	"v1/Namespace":                      {"namespaces", false},
	"v1/Secret":                         {"secrets", true},
	"v1/Service":                        {"services", true},
	"v1/ConfigMap":                      {"configmaps", true},
	"discovery.k8s.io/v1/EndpointSlice": {"endpointslices", true},
	"apiextensions.k8s.io/v1/CustomResourceDefinition": {"customresourcedefinitions", false},
	"traefik.io/v1alpha1/Middleware":                   {"middlewares", true},
	"traefik.io/v1alpha1/IngressRoute":                 {"ingressroutes", true},
	"gateway.networking.k8s.io/v1/GatewayClass":        {"gatewayclasses", false},
	"gateway.networking.k8s.io/v1/Gateway":             {"gateways", true},
	"gateway.networking.k8s.io/v1/HTTPRoute":           {"httproutes", true},
}

// ObjectPath returns the API path of obj (a decoded manifest document).
func ObjectPath(obj map[string]interface{}) (string, error) {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	meta, _ := obj["metadata"].(map[string]interface{})
	name, _ := meta["name"].(string)
	ns, _ := meta["namespace"].(string)

	k, ok := kinds[apiVersion+"/"+kind]
	if !ok || name == "" {
		return "", fmt.Errorf("cannot apply %s %s %q", apiVersion, kind, name)
	}

	base := "/apis/" + apiVersion
	if !strings.Contains(apiVersion, "/") {
		base = "/api/" + apiVersion
	}

	if k.namespaced {
		if ns == "" {
			ns = "default"
		}

		base += "/namespaces/" + url.PathEscape(ns)
	}

	return base + "/" + k.plural + "/" + url.PathEscape(name), nil
}

// Apply creates or updates obj as `kubectl apply --server-side --force-conflicts` does.
func (k *Kube) Apply(obj map[string]interface{}) error {
	path, err := ObjectPath(obj)
	if err != nil {
		return err
	}

	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}

	code, out, err := k.Do(http.MethodPatch, path+"?fieldManager=tierlimit-e2e&force=true", "application/apply-patch+yaml", body)
	if err != nil {
		return err
	}

	if code != http.StatusOK && code != http.StatusCreated {
		return fmt.Errorf("apply %s: %d %s", path, code, out)
	}

	return nil
}

// ApplyYAML applies every document of a multi-document YAML text.
func (k *Kube) ApplyYAML(text []byte) error {
	docs, err := SplitYAML(text)
	if err != nil {
		return err
	}

	for _, d := range docs {
		if err := k.Apply(d); err != nil {
			return err
		}
	}

	return nil
}

// SplitYAML decodes every non-empty document of a multi-document YAML text.
func SplitYAML(text []byte) ([]map[string]interface{}, error) {
	var out []map[string]interface{}

	for i, doc := range strings.Split("\n"+string(text), "\n---") {
		var obj map[string]interface{}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}

		if len(obj) > 0 {
			out = append(out, obj)
		}
	}

	return out, nil
}

// WaitServed waits until the API server serves the list of a custom
// resource (its CRD established), given as "<group>/<version>/<plural>".
func (k *Kube) WaitServed(limit time.Duration, resources ...string) error {
	deadline := time.Now().Add(limit)

	for _, r := range resources {
		for {
			code, out, err := k.Do(http.MethodGet, "/apis/"+r, "", nil)
			if err == nil && code == http.StatusOK {
				break
			}

			if time.Now().After(deadline) {
				return fmt.Errorf("%s not served within %s: %d %s %v", r, limit, code, out, err)
			}

			time.Sleep(100 * time.Millisecond)
		}
	}

	return nil
}

// HostIP returns a non-loopback IPv4 address of this machine: EndpointSlices
// refuse loopback addresses, so the processes that stand for pods listen on it.
func HostIP() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}

	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String(), nil
		}
	}

	return "", errors.New("no non-loopback IPv4 address: EndpointSlices need one")
}

func waitTCP(addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)

	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}

		time.Sleep(100 * time.Millisecond)
	}

	return fmt.Errorf("%s not listening within %s", addr, limit)
}

func writeRSAKey(keyFile, pubFile string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}

	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}

	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}

	return os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}

	return strings.Join(lines, "\n")
}
