// Package docs serves the browsable documentation of the HTTP API: a page that
// renders the service's OpenAPI document with Swagger UI, "Try it out" included.
// Swagger UI's assets are embedded in the binary, so the page needs no CDN and
// no internet access. assets/VERSION records their version; fetch-assets.sh
// refreshes them.
package docs

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
)

//go:embed index.html init.js assets
var files embed.FS

var indexTemplate = template.Must(template.ParseFS(files, "index.html"))

// contentSecurityPolicy lets the page load only what the service itself serves.
// Swagger UI sets inline style attributes and uses data: URIs for icons.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; " +
	"style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the documentation page for the OpenAPI document at specURL
// (same origin): the page at / and /index.html, /init.js, and Swagger UI's
// files under /assets/, all embedded. Other paths (ErrNoSuchFile) and methods
// (ErrMethod) go to fail. Under chi's Mount it reads the path below the mount
// point from the route context; elsewhere, strip the prefix first.
func Handler(specURL string, fail func(http.ResponseWriter, *http.Request, error)) http.Handler {
	h := &handler{specURL: specURL, fail: fail, assets: make(map[string]asset)}
	add := func(name, urlPath string) {
		body, err := fs.ReadFile(files, name)
		if err != nil {
			panic("docs: embedded file missing: " + name) // cannot happen: go:embed checks
		}
		sum := sha256.Sum256(body)
		h.assets[urlPath] = asset{
			body:        body,
			contentType: contentType(name),
			etag:        `"` + hex.EncodeToString(sum[:16]) + `"`,
		}
	}
	add("init.js", "/init.js")
	names, err := fs.Glob(files, "assets/*")
	if err != nil {
		panic("docs: " + err.Error()) // cannot happen: the pattern is valid
	}
	for _, name := range names {
		add(name, "/"+name)
	}
	return h
}

// The refusals the handler hands to its fail function.
var (
	ErrNoSuchFile = errors.New("no such documentation file")
	ErrMethod     = errors.New("the documentation is read with GET or HEAD")
)

type handler struct {
	specURL string
	fail    func(http.ResponseWriter, *http.Request, error)
	assets  map[string]asset // by path below the mount point, e.g. "/assets/swagger-ui.css"
}

type asset struct {
	body        []byte
	contentType string
	etag        string
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		h.fail(w, r, ErrMethod)
		return
	}
	rel := relativePath(r)
	switch rel {
	case "", "/", "/index.html":
		h.serveIndex(w, r, rel)
		return
	}
	a, ok := h.assets[rel]
	if !ok {
		h.fail(w, r, ErrNoSuchFile)
		return
	}
	w.Header().Set("Content-Type", a.contentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// Revalidate each time: a new binary may carry new assets under the same
	// names, and the ETag makes revalidation a cheap 304.
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", a.etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}

func (h *handler) serveIndex(w http.ResponseWriter, r *http.Request, rel string) {
	var buf bytes.Buffer
	data := struct{ Base, SpecURL string }{mountPrefix(r, rel), h.specURL}
	if err := indexTemplate.Execute(&buf, data); err != nil {
		h.fail(w, r, fmt.Errorf("render the documentation page: %w", err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Content-Security-Policy", contentSecurityPolicy)
	w.Header().Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(buf.Bytes())
}

// relativePath returns the request's path below the handler's mount point.
func relativePath(r *http.Request) string {
	if rctx := chi.RouteContext(r.Context()); rctx != nil && rctx.RoutePath != "" {
		return rctx.RoutePath
	}
	return r.URL.Path
}

// mountPrefix returns the path the handler is mounted at, as the client sent it
// ("/docs"; "" at the root), for a request of the page whose path below the
// mount point is rel. It reads the original request line, which neither chi nor
// http.StripPrefix rewrite, and keeps its escaping.
func mountPrefix(r *http.Request, rel string) string {
	p := r.URL.EscapedPath()
	if u, err := url.ParseRequestURI(r.RequestURI); r.RequestURI != "" && err == nil {
		p = u.EscapedPath()
	}
	if rel == "" || rel == "/" {
		p = strings.TrimSuffix(p, "/")
	} else {
		p = strings.TrimSuffix(p, rel)
	}
	// A path starting with "//" would read as a host name in the page's URLs.
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return ""
	}
	return "/" + p
}

func contentType(name string) string {
	switch path.Ext(name) {
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	default: // LICENSE, NOTICE, VERSION, *.txt
		return "text/plain; charset=utf-8"
	}
}
