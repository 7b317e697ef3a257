package examplecheck

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"gopkg.in/yaml.v3"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

func loadCompose(t *testing.T) *types.Project {
	t.Helper()

	root := harness.RepoRoot()

	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root), cli.WithName("tierlimit"), cli.WithResolvedPaths(true))
	if err != nil {
		t.Fatal(err)
	}

	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("Docker Compose cannot load docker-compose.yml: %v", err)
	}

	return project
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()

	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("docker-compose.yml has no service %q", name)
	}

	return s
}

// TestComposeStartsInOrder: Traefik waits for a healthy Redis and auth server,
// has a healthcheck of its own on /ping, and the auth server is an image built
// from a Dockerfile, not compiled when the container starts.
func TestComposeStartsInOrder(t *testing.T) {
	p := loadCompose(t)

	var names []string
	for name := range p.Services {
		names = append(names, name)
	}

	if len(names) != 4 {
		t.Fatalf("services %v, want traefik, whoami, auth and redis", names)
	}

	traefik := service(t, p, "traefik")
	for _, dep := range []string{"auth", "redis"} {
		if d, ok := traefik.DependsOn[dep]; !ok || d.Condition != types.ServiceConditionHealthy {
			t.Errorf("traefik depends_on %s: %+v, want condition: service_healthy", dep, d)
		}

		if hc := service(t, p, dep).HealthCheck; hc == nil || hc.Disable || len(hc.Test) < 2 {
			t.Errorf("%s has no healthcheck: %+v", dep, hc)
		}
	}

	if hc := traefik.HealthCheck; hc == nil || strings.Join(hc.Test, " ") != "CMD traefik healthcheck --ping" {
		t.Errorf("traefik healthcheck: %+v, want traefik healthcheck --ping", hc)
	}

	if !contains(traefik.Command, "--ping=true") {
		t.Errorf("traefik command %v: no --ping=true, so its healthcheck can never pass", traefik.Command)
	}

	auth := service(t, p, "auth")
	if auth.Build == nil {
		t.Fatal("auth is not built from a Dockerfile")
	}

	if len(auth.Command) > 0 || strings.Contains(strings.Join(auth.Entrypoint, " "), "go ") {
		t.Errorf("auth runs %v %v: the image's entrypoint should start the built server", auth.Entrypoint, auth.Command)
	}

	df := dockerfile(t, filepath.Join(auth.Build.Context, auth.Build.Dockerfile))
	if auth.HealthCheck.Test[1] != df.entrypoint[0] {
		t.Errorf("auth healthcheck runs %q, the image's server is %q", auth.HealthCheck.Test[1], df.entrypoint[0])
	}

	if !contains(auth.HealthCheck.Test, "-healthcheck") {
		t.Errorf("auth healthcheck %v does not pass -healthcheck", auth.HealthCheck.Test)
	}

	if redis := service(t, p, "redis"); strings.Join(redis.HealthCheck.Test, " ") != "CMD redis-cli ping" {
		t.Errorf("redis healthcheck: %v", redis.HealthCheck.Test)
	}
}

// TestComposeMountsAndLabels: Traefik finds the plugin where local mode looks
// for it, reads the Docker socket, and the backend carries exactly the labels
// of examples/docker/labels.yml, whose hosts are services of this file.
func TestComposeMountsAndLabels(t *testing.T) {
	p := loadCompose(t)
	root := harness.RepoRoot()
	traefik := service(t, p, "traefik")

	if !contains(traefik.Command, "--experimental.localPlugins.tierlimit.moduleName="+harness.ModuleName) {
		t.Errorf("traefik command %v does not load the plugin in local mode", traefik.Command)
	}

	if traefik.WorkingDir != "/" {
		t.Errorf("traefik working_dir %q: local plugins are read from ./plugins-local relative to it", traefik.WorkingDir)
	}

	mounts := map[string]types.ServiceVolumeConfig{}
	for _, v := range traefik.Volumes {
		mounts[v.Target] = v
	}

	plugin := mounts["/plugins-local/src/"+harness.ModuleName]
	if plugin.Type != types.VolumeTypeBind || plugin.Source != root || !plugin.ReadOnly {
		t.Errorf("plugin mount %+v: want the repository root (%s), read-only", plugin, root)
	}

	if sock := mounts["/var/run/docker.sock"]; sock.Source != "/var/run/docker.sock" || !sock.ReadOnly {
		t.Errorf("docker socket mount: %+v", sock)
	}

	raw, err := os.ReadFile(filepath.Join(root, "examples/docker/labels.yml"))
	if err != nil {
		t.Fatal(err)
	}

	var doc struct{ Labels []string }
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}

	want := types.Labels{}
	for _, l := range doc.Labels {
		k, v, _ := strings.Cut(l, "=")
		want[k] = v
	}

	whoami := service(t, p, "whoami")
	if !reflect.DeepEqual(map[string]string(whoami.Labels), map[string]string(want)) {
		t.Errorf("whoami labels differ from examples/docker/labels.yml:\n got %v\nwant %v", whoami.Labels, want)
	}

	var planHeaders []string
	for k, v := range want {
		if strings.HasSuffix(strings.ToLower(k), ".principal.planheader") && v != "" {
			planHeaders = append(planHeaders, v)
		}
	}

	if len(planHeaders) == 0 {
		t.Error("examples/docker/labels.yml sets no principal.planHeader")
	}

	checkAuthResponseHeaders(t, "examples/docker/labels.yml",
		strings.Split(want["traefik.http.middlewares.auth.forwardauth.authResponseHeaders"], ","), planHeaders...)

	for _, k := range []string{
		"traefik.http.middlewares.auth.forwardauth.address",
		"traefik.http.middlewares.ratelimit-edge.plugin.tierlimit.redis.address",
		"traefik.http.middlewares.ratelimit-principal.plugin.tierlimit.redis.address",
	} {
		host := strings.TrimPrefix(want[k], "http://")
		host, _, _ = strings.Cut(host, ":")

		if _, ok := p.Services[host]; !ok {
			t.Errorf("%s = %q: no service %q in docker-compose.yml", k, want[k], host)
		}
	}
}

// TestAuthServerImageBuilds runs the build stage of the auth server's
// Dockerfile without Docker: only the files it COPYs, no network, the same go
// build command.
func TestAuthServerImageBuilds(t *testing.T) {
	auth := service(t, loadCompose(t), "auth")
	df := dockerfile(t, filepath.Join(auth.Build.Context, auth.Build.Dockerfile))

	ctx := t.TempDir()
	for _, c := range df.copies {
		for _, src := range c.srcs {
			dst := filepath.Join(ctx, c.dst)
			if strings.HasSuffix(c.dst, "/") || len(c.srcs) > 1 {
				dst = filepath.Join(dst, filepath.Base(src))
			}

			copyTree(t, filepath.Join(auth.Build.Context, src), dst)
		}
	}

	out := filepath.Join(t.TempDir(), "authserver")
	args := append([]string{"build"}, df.buildArgs...)

	for i, a := range args {
		if a == "-o" {
			args[i+1] = out
		}
	}

	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(ctx, df.workdir)
	cmd.Env = append(os.Environ(), df.buildEnv...)
	cmd.Env = append(cmd.Env, "GOPROXY=off", "GOFLAGS=-modcacherw -buildvcs=false", "GOMODCACHE="+t.TempDir(), "GOWORK=off")

	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build stage fails with only its COPY sources: %v\n%s", err, b)
	}

	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
}

type copyStep struct {
	srcs []string
	dst  string
}

// dockerFile is what the tests need of a two-stage Dockerfile.
type dockerFile struct {
	copies     []copyStep // the first stage's COPY instructions, destinations relative to /
	workdir    string     // the first stage's last WORKDIR, relative to /
	buildEnv   []string
	buildArgs  []string // after "go build"
	entrypoint []string // the last stage's
}

func dockerfile(t *testing.T, path string) dockerFile {
	t.Helper()

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	var df dockerFile

	stages := 0
	workdir := "/"

	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}

		switch strings.ToUpper(f[0]) {
		case "FROM":
			stages++
		case "WORKDIR":
			if stages == 1 && filepath.IsAbs(f[1]) {
				workdir = f[1]
			} else if stages == 1 {
				workdir = filepath.Join(workdir, f[1])
			}
		case "COPY":
			if stages == 1 {
				dst := f[len(f)-1]
				if !filepath.IsAbs(dst) {
					dst = filepath.Join(workdir, dst) + map[bool]string{true: "/"}[strings.HasSuffix(dst, "/")]
				}

				df.copies = append(df.copies, copyStep{srcs: f[1 : len(f)-1], dst: dst})
			}
		case "RUN":
			for i := 1; i+1 < len(f); i++ {
				if f[i] == "go" && f[i+1] == "build" {
					df.buildEnv, df.buildArgs = f[1:i], f[i+2:]
				}
			}
		case "ENTRYPOINT":
			if err := yaml.Unmarshal([]byte(strings.TrimSpace(line[len(f[0]):])), &df.entrypoint); err != nil {
				t.Fatalf("%s: ENTRYPOINT: %v", path, err)
			}
		}
	}

	df.workdir = workdir

	if stages < 2 || df.buildArgs == nil || len(df.entrypoint) == 0 {
		t.Fatalf("%s: want a build stage running go build and a final stage with an ENTRYPOINT: %+v", path, df)
	}

	return df
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()

	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}

		target := filepath.Join(dst, strings.TrimPrefix(p, src))
		if info.IsDir() {
			return os.MkdirAll(target, 0o755)
		}

		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}

		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}

		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatalf("COPY %s: %v", src, err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}

	return false
}

// checkAuthResponseHeaders: ForwardAuth must overwrite both principal headers,
// or a client sends X-Auth-Service-Account: true itself and gets the service
// tier, and every plan header some plugin instance reads (planHeaders), or
// he sends X-Auth-Plan: pro and gets the pro plan.
func checkAuthResponseHeaders(t *testing.T, where string, headers []string, planHeaders ...string) {
	t.Helper()

	for _, h := range append([]string{"X-Auth-User", "X-Auth-Service-Account"}, planHeaders...) {
		if !contains(headers, h) {
			t.Errorf("%s: forwardAuth authResponseHeaders %v lacks %s: clients could set it themselves", where, headers, h)
		}
	}
}
