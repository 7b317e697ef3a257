package configdecode

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/e2e/configfuzz"
)

// TestFuzzCorpusThroughTraefik replays configfuzz's corpus (the seeds and
// every input the fuzzer failed on once) through Traefik's own loader:
// Traefik's decoding into the interpreted plugin's Config, and New under
// Yaegi. Each builds, or fails with the error the compiled plugin gives
// after configfuzz.Decode (Traefik's decoding, compiled): so the fuzzer's
// decoding is Traefik's, and no configuration of the corpus makes New
// panic under Yaegi either.
func TestFuzzCorpusThroughTraefik(t *testing.T) {
	files, err := filepath.Glob("../configfuzz/testdata/fuzz/FuzzNewNeverPanics/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}

	for _, f := range files {
		base, ops := corpusEntry(t, f)
		m := configfuzz.Config(base, ops)

		want := compiledError(configfuzz.Config(base, ops))
		if got := yaegiError(t, m); got != want {
			t.Errorf("%s: under Yaegi: %q\ncompiled: %q\nconfiguration: %#v", filepath.Base(f), got, want, m)
		}
	}
}

// corpusEntry reads a corpus file of FuzzNewNeverPanics: its two []byte
// arguments.
func corpusEntry(t *testing.T, path string) ([]byte, []byte) {
	t.Helper()

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 3 || lines[0] != "go test fuzz v1" {
		t.Fatalf("%s: not a corpus entry of two arguments", path)
	}

	var args [2][]byte

	for i, line := range lines[1:] {
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(line, "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}

		args[i] = []byte(s)
	}

	return args[0], args[1]
}

// compiledError is what the compiled plugin says of m: Traefik's decoding
// error, New's, or "".
func compiledError(m map[string]any) string {
	cfg, err := configfuzz.Decode(m)
	if err != nil {
		return "failed to decode configuration: " + err.Error()
	}

	if _, err := tierlimit.New(context.Background(), http.NotFoundHandler(), cfg, "configdecode@test"); err != nil {
		return err.Error()
	}

	return ""
}

// yaegiError is newError with a panic reported as the error it would be.
func yaegiError(t *testing.T, m map[string]any) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = "panic under Yaegi"
		}
	}()

	return newError(t, m)
}
