package request

import (
	"strings"
	"testing"
)

func TestCanonicalPath(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"/auth/login", "/auth/login"},
		{"/", "/"},
		{"", "/"},
		{"*", "/*"},
		{"/auth/login/", "/auth/login/"},
		{"/auth/login//", "/auth/login/"},
		{"/AUTH/LOGIN", "/AUTH/LOGIN"},
		{"/Auth/Login", "/Auth/Login"},
		{"/auth/login;jsessionid=1", "/auth/login"},
		{"/auth;x=1/login;y", "/auth/login"},
		{"/auth/login;/", "/auth/login/"},
		{"/;x/auth/login", "/auth/login"},
		// Go has decoded %2F already: the request /assets/..%2Fauth/login.
		{"/assets/../auth/login", "/auth/login"},
		{"/assets/..;/auth/login", "/auth/login"},
		{"//auth/login", "/auth/login"},
		{"/auth/./login", "/auth/login"},
		{"/auth//login", "/auth/login"},
		{"/auth/login/.", "/auth/login"},
		{"/auth/x/../login", "/auth/login"},
		{"/../../auth/login", "/auth/login"},
		{`/auth\login`, "/auth/login"},
		// Encoded once more, and twice more.
		{"/assets/..%2Fauth/login", "/auth/login"},
		{"/assets/..%252Fauth/login", "/auth/login"},
		{"/auth/%2e%2e/auth/login", "/auth/login"},
		{"/auth/%6Cogin", "/auth/login"},
		{"/auth/login%3Bx=1", "/auth/login"},
		{"/auth/%25%36%63ogin", "/auth/login"},
		// An escape Go would refuse: the valid ones around it still decode.
		{"/auth/%zz/%2e%2e/login", "/auth/login"},
		{"/a%", "/a%"},
		{"/a/%0%0X/%2e%2e/b", "/a/b"},
		{"/a/%%41", "/a/%A"},
		{"/.hidden", "/.hidden"},
		{"/a/..b", "/a/..b"},
		{"/auth/loginx", "/auth/loginx"},
	}

	for _, tt := range tests {
		if got := CanonicalPath(tt.in, false); got != tt.want {
			t.Errorf("CanonicalPath(%q, false) = %q, want %q", tt.in, got, tt.want)
		}

		if got, want := CanonicalPath(tt.in, true), strings.ToLower(tt.want); got != want {
			t.Errorf("CanonicalPath(%q, true) = %q, want %q", tt.in, got, want)
		}
	}

	if got := CanonicalPath("/Caf\u00c9/", true); got != "/caf\u00e9/" {
		t.Errorf("CanonicalPath folds %q, want %q", got, "/caf\u00e9/")
	}
}

// A path with nothing to canonicalise comes back as it is, unallocated.
func TestCanonicalPathFastPath(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are counted without the race detector: make unit runs this test again without it")
	}

	for _, p := range []string{"/api/v1/items/42", "/api/v1/items/"} {
		if n := testing.AllocsPerRun(100, func() { _ = CanonicalPath(p, true) }); n != 0 {
			t.Errorf("CanonicalPath(%q) allocates %v times, want 0", p, n)
		}
	}
}

func TestCanonicalPattern(t *testing.T) {
	tests := []struct {
		in            string
		caseSensitive bool
		want          string
	}{
		{"/auth/login", false, "/auth/login"},
		{"/Auth/Login/", false, "/auth/login/"},
		{"/Auth/Login/", true, "/Auth/Login/"},
		{"/assets/", false, "/assets/"},
		{"//static//", false, "/static/"},
		{"/", false, "/"},
		{"/static", false, "/static"},
	}

	for _, tt := range tests {
		if got := CanonicalPattern(tt.in, tt.caseSensitive); got != tt.want {
			t.Errorf("CanonicalPattern(%q, %v) = %q, want %q", tt.in, tt.caseSensitive, got, tt.want)
		}
	}
}

func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{
		"/auth/login", "/auth/login/", "/AUTH/LOGIN", "/auth/login;jsessionid=1", "/assets/../auth/login",
		"//auth/login", "/auth/./login", "/auth//login", "/a/%2e%2e/%252F;x\\y", "", "%", "/\u0130\u212a", "/%000;x%0%0X", "/Api/Items", "/api/\xc3", "/caf\u00c9",
	} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, in string) {
		got := CanonicalPath(in, false)

		if !strings.HasPrefix(got, "/") {
			t.Fatalf("CanonicalPath(%q) = %q: want it to start with /", in, got)
		}

		// Rooted: at most the "/" it adds longer than its input.
		if len(got) > len(in)+1 {
			t.Fatalf("CanonicalPath(%q) = %q: longer than its input", in, got)
		}

		if again := CanonicalPath(got, false); again != got {
			t.Fatalf("CanonicalPath not idempotent: %q -> %q -> %q", in, got, again)
		}

		// The one-search check skips only paths that stay as they are.
		for _, fold := range []bool{false, true} {
			if got, want := CanonicalPath(in, fold), canonicalForm(in, fold); got != want {
				t.Fatalf("CanonicalPath(%q, %v) = %q, want %q", in, fold, got, want)
			}
		}

		folded := CanonicalPath(in, true)
		if again := CanonicalPath(folded, true); again != folded {
			t.Fatalf("CanonicalPath(_, true) not idempotent: %q -> %q -> %q", in, folded, again)
		}
	})
}
