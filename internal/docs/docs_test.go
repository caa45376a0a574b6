package docs

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
)

const specURL = "/openapi.yaml"

// mounts are the ways the handler may be wired into a server, keyed by name,
// with the path the page is then served at.
var mounts = []struct {
	name   string
	prefix string
	server func() http.Handler
}{
	{"chi Mount", "/docs", func() http.Handler {
		r := chi.NewRouter()
		r.Mount("/docs", Handler(specURL, fail))
		return r
	}},
	{"chi Mount, nested", "/api/docs", func() http.Handler {
		api := chi.NewRouter()
		api.Mount("/docs", Handler(specURL, fail))
		r := chi.NewRouter()
		r.Mount("/api", api)
		return r
	}},
	{"ServeMux with StripPrefix", "/docs", func() http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/docs/", http.StripPrefix("/docs", Handler(specURL, fail)))
		mux.Handle("/docs", http.StripPrefix("/docs", Handler(specURL, fail)))
		return mux
	}},
	{"root", "", func() http.Handler { return Handler(specURL, fail) }},
}

func setup(t *testing.T, server http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(server)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, srv *httptest.Server, method, path string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

var refAttr = regexp.MustCompile(`(?:src|href)="([^"]*)"`)

// TestIndexReferencesOnlyLocalAssets loads the page the ways a browser may ask
// for it, under every mount, and follows each URL it refers to.
func TestIndexReferencesOnlyLocalAssets(t *testing.T) {
	t.Parallel()
	wantTypes := map[string]string{
		".js":  "text/javascript; charset=utf-8",
		".css": "text/css; charset=utf-8",
	}
	for _, m := range mounts {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := setup(t, m.server())
			for _, page := range []string{m.prefix, m.prefix + "/", m.prefix + "/index.html"} {
				if page == "" {
					continue // the root itself is "/"
				}
				resp, body := get(t, srv, http.MethodGet, page, nil)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("GET %s: status %d, body %s", page, resp.StatusCode, body)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
					t.Errorf("GET %s: Content-Type %q, want text/html", page, ct)
				}
				if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
					t.Errorf("GET %s: Content-Security-Policy %q does not confine scripts to the service", page, csp)
				}
				if !strings.Contains(body, `data-spec-url="`+specURL+`"`) {
					t.Errorf("GET %s: the page does not render %s:\n%s", page, specURL, body)
				}
				if strings.Contains(body, "http:") || strings.Contains(body, "https:") {
					t.Errorf("GET %s: the page names an external URL:\n%s", page, body)
				}

				refs := refAttr.FindAllStringSubmatch(body, -1)
				if len(refs) < 3 {
					t.Fatalf("GET %s: want the stylesheet and two scripts, found %q", page, refs)
				}
				for _, ref := range refs {
					u := ref[1]
					if u == "data:," { // the empty favicon, which spares a request
						continue
					}
					if !strings.HasPrefix(u, m.prefix+"/") || strings.HasPrefix(u, "//") {
						t.Errorf("GET %s: refers to %q, want a path under %s/", page, u, m.prefix)
						continue
					}
					aresp, abody := get(t, srv, http.MethodGet, u, nil)
					if aresp.StatusCode != http.StatusOK || len(abody) == 0 {
						t.Errorf("GET %s (from %s): status %d, %d bytes", u, page, aresp.StatusCode, len(abody))
						continue
					}
					ext := u[strings.LastIndex(u, "."):]
					if got, want := aresp.Header.Get("Content-Type"), wantTypes[ext]; got != want {
						t.Errorf("GET %s: Content-Type %q, want %q", u, got, want)
					}
				}
			}
		})
	}
}

func TestAssets(t *testing.T) {
	t.Parallel()
	srv := setup(t, mounts[0].server())

	tests := []struct {
		path        string
		contentType string
		contains    string
	}{
		{"/docs/assets/swagger-ui-bundle.js", "text/javascript; charset=utf-8", "SwaggerUIBundle"},
		{"/docs/assets/swagger-ui.css", "text/css; charset=utf-8", ".swagger-ui"},
		{"/docs/init.js", "text/javascript; charset=utf-8", "persistAuthorization: true"},
		{"/docs/assets/LICENSE", "text/plain; charset=utf-8", "Apache License"},
		{"/docs/assets/NOTICE", "text/plain; charset=utf-8", "swagger-ui"},
		{"/docs/assets/VERSION", "text/plain; charset=utf-8", "5."},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			t.Parallel()
			resp, body := get(t, srv, http.MethodGet, tt.path, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := resp.Header.Get("Content-Type"); got != tt.contentType {
				t.Errorf("Content-Type %q, want %q", got, tt.contentType)
			}
			if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options %q, want nosniff", got)
			}
			if !strings.Contains(body, tt.contains) {
				t.Errorf("body does not contain %q", tt.contains)
			}

			etag := resp.Header.Get("ETag")
			if etag == "" {
				t.Fatal("no ETag")
			}
			again, body := get(t, srv, http.MethodGet, tt.path, http.Header{"If-None-Match": {etag}})
			if again.StatusCode != http.StatusNotModified || body != "" {
				t.Errorf("GET with If-None-Match: status %d, %d bytes; want 304 and no body", again.StatusCode, len(body))
			}
		})
	}
}

func TestInitConfiguresTryItOut(t *testing.T) {
	t.Parallel()
	js, err := files.ReadFile("init.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"deepLinking: true",
		"persistAuthorization: true",
		"tryItOutEnabled: true",
		"validatorUrl: null",
		"getAttribute('data-spec-url')",
	} {
		if !strings.Contains(string(js), want) {
			t.Errorf("init.js lacks %q", want)
		}
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	srv := setup(t, mounts[0].server())

	tests := []struct {
		name   string
		method string
		path   string
		status int
		code   string
	}{
		{"unknown file", http.MethodGet, "/docs/nope.html", http.StatusNotFound, "not-found"},
		{"unknown asset", http.MethodGet, "/docs/assets/swagger-ui.js.map", http.StatusNotFound, "not-found"},
		{"embedded but not served", http.MethodGet, "/docs/docs.go", http.StatusNotFound, "not-found"},
		{"POST", http.MethodPost, "/docs/", http.StatusMethodNotAllowed, "method-not-allowed"},
		{"DELETE an asset", http.MethodDelete, "/docs/assets/swagger-ui.css", http.StatusMethodNotAllowed, "method-not-allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, body := get(t, srv, tt.method, tt.path, nil)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			if !strings.Contains(body, "refused: "+tt.code) {
				t.Errorf("body %s, want the refusal %q handed to fail", body, tt.code)
			}
			if tt.status == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow %q, want \"GET, HEAD\"", resp.Header.Get("Allow"))
			}
		})
	}
}

func TestHead(t *testing.T) {
	t.Parallel()
	srv := setup(t, mounts[0].server())
	for _, path := range []string{"/docs/", "/docs/assets/swagger-ui.css"} {
		resp, body := get(t, srv, http.MethodHead, path, nil)
		if resp.StatusCode != http.StatusOK || body != "" {
			t.Errorf("HEAD %s: status %d, %d bytes; want 200 and no body", path, resp.StatusCode, len(body))
		}
	}
}

func TestMountPrefixNeverNamesAHost(t *testing.T) {
	t.Parallel()
	r := chi.NewRouter()
	r.Mount("/{tenant}/docs", Handler(specURL, fail))
	srv := setup(t, r)

	// The tenant segment decodes to "//evil.example": kept escaped, it stays a path.
	for _, path := range []string{"/%2F%2Fevil.example/docs/", "/%2F%2Fevil.example/docs"} {
		resp, body := get(t, srv, http.MethodGet, path, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: status %d", path, resp.StatusCode)
		}
		for _, ref := range refAttr.FindAllStringSubmatch(body, -1) {
			if strings.HasPrefix(ref[1], "//") {
				t.Errorf("GET %s: the page refers to %q, which names a host", path, ref[1])
			}
		}
	}
}

// fail stands in for the API's error writer (httpapi's problem table turns
// these errors into problems; its tests check that): it answers with the
// status and names the refusal it was handed.
func fail(w http.ResponseWriter, _ *http.Request, err error) {
	switch {
	case errors.Is(err, ErrNoSuchFile):
		http.Error(w, "refused: not-found", http.StatusNotFound)
	case errors.Is(err, ErrMethod):
		http.Error(w, "refused: method-not-allowed", http.StatusMethodNotAllowed)
	default:
		http.Error(w, "refused: "+err.Error(), http.StatusInternalServerError)
	}
}
