package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/exactlyonce/payments/internal/idempotency"
)

// readPost checks everything about a POST that can be checked before its key is
// claimed (after canonicalPost): the Idempotency-Key header, the content type,
// the size and the JSON shape. It decodes the body strictly into dst and
// fingerprints the request. On failure it has answered with a problem (never
// stored) and returns false.
func (s *Server) readPost(w http.ResponseWriter, r *http.Request, dst any) (idempotency.Request, bool) {
	key, err := idempotency.ParseKey(r.Header)
	if err != nil {
		s.fail(w, r, err)
		return idempotency.Request{}, false
	}
	accessFrom(r.Context()).keyHash = idempotency.KeyHash(merchantFrom(r.Context()), key)
	if len(r.Header.Values("Content-Type")) > 1 {
		s.fail(w, r, &bodyError{detail: "Content-Type is sent more than once; send it once, application/json"})
		return idempotency.Request{}, false
	}
	if err := checkContentType(r.Header.Get("Content-Type")); err != nil {
		s.fail(w, r, err)
		return idempotency.Request{}, false
	}
	if r.ContentLength > MaxBodyBytes {
		s.fail(w, r, errTooLarge)
		return idempotency.Request{}, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.fail(w, r, errTooLarge)
		} else {
			s.fail(w, r, &bodyError{detail: "could not read the request body"})
		}
		return idempotency.Request{}, false
	}
	canonical, err := decodeBody(body, dst)
	if err != nil {
		s.fail(w, r, err)
		return idempotency.Request{}, false
	}
	return idempotency.Request{
		MerchantID:  merchantFrom(r.Context()),
		Key:         key,
		Fingerprint: idempotency.NewFingerprint(r.Method, r.URL.Path, canonical),
	}, true
}

// canonicalPost refuses with 400, before routing and so before any key is
// claimed, a POST whose path percent-encodes what needs no encoding
// (/v1/accounts/%61cct_…, …%2Fdeposits). chi routes such a path by its raw
// form, while the fingerprint covers the decoded one: the two would disagree.
// Routing by the decoded form instead would make %2F a separator. No route or
// id of this API needs encoding.
func (s *Server) canonicalPost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// RawPath is set only when the path was sent encoded otherwise than Go would.
		if r.Method == http.MethodPost && r.URL.RawPath != "" {
			s.fail(w, r, &bodyError{detail: "the path percent-encodes characters that need no encoding; send it as is (ids are plain ASCII)"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Refusals of a request before its key is claimed. The problem table maps
// them to their statuses, like every other error.
var (
	errTooLarge = fmt.Errorf("the request body exceeds %d bytes", MaxBodyBytes)
	// errMediaType and errInvalidBody are what mediaError and bodyError are.
	errMediaType   = errors.New("unsupported media type")
	errInvalidBody = errors.New("invalid request body")
)

// mediaError refuses a request's Content-Type.
type mediaError string

func (e mediaError) Error() string        { return string(e) }
func (e mediaError) Is(target error) bool { return target == errMediaType }

// bodyError refuses a request's body, path or query string, naming the
// member or parameter at fault.
type bodyError struct{ field, detail string }

func (e *bodyError) Error() string        { return e.detail }
func (e *bodyError) Is(target error) bool { return target == errInvalidBody }

// checkContentType accepts application/json, with no charset or UTF-8.
func checkContentType(ct string) error {
	mediaType, params, err := mime.ParseMediaType(ct)
	if err != nil || mediaType != "application/json" {
		return mediaError(fmt.Sprintf("Content-Type must be application/json, got %q", ct))
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return mediaError(fmt.Sprintf("the charset must be UTF-8, got %q", cs))
	}
	return nil
}

// readOptionalPost is readPost for a POST whose body may be left out (a
// capture, a void): a request with no body reads, and fingerprints, as {},
// whatever its Content-Type says.
func (s *Server) readOptionalPost(w http.ResponseWriter, r *http.Request, dst any) (idempotency.Request, bool) {
	if r.ContentLength == 0 {
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader("{}")), 2
		r.Header.Set("Content-Type", "application/json")
	}
	return s.readPost(w, r, dst)
}

// decodeBody parses body once and decodes it into dst. It returns the body's
// canonical form, for the fingerprint, or the refusal (a bodyError).
func decodeBody(body []byte, dst any) ([]byte, error) {
	doc, err := idempotency.Parse(body)
	if err != nil {
		return nil, &bodyError{detail: err.Error()}
	}
	return doc.Canonical, decodeDocument(doc.Value, dst)
}

// refuse is a refusal of the request body naming field.
func refuse(field, format string, args ...any) error {
	return &bodyError{field: field, detail: fmt.Sprintf(format, args...)}
}

// decodeDocument fills the struct dst points to from a parsed JSON object,
// matching member names exactly to its fields' json tags (encoding/json would
// match them case-insensitively, so {"amount":5,"Amount":6} would decode by
// member order while the fingerprint ignores that order). It refuses unknown
// members, wrong types and null (which no request member allows: read as
// "absent" it would take a field's default, which for a capture or a refund
// is the most money) with a detail that names the member. dst's fields are strings, *string, *int64, *bool,
// map[string]string and []string, all the request bodies need.
func decodeDocument(doc any, dst any) error {
	members, isObject := doc.([]idempotency.Member)
	switch {
	case doc == nil:
		return refuse("", "the request body must be a JSON object, got null: send {} (or, where the body may be left out, nothing)")
	case !isObject:
		return refuse("", "the request body must be a JSON object, got %s", kindOf(doc))
	}
	v := reflect.ValueOf(dst).Elem()
	t := v.Type()
	for _, m := range members {
		i := fieldIndex(t, m.Name)
		if i < 0 {
			for j := range t.NumField() {
				if strings.EqualFold(jsonName(t.Field(j)), m.Name) {
					return refuse(m.Name, "unknown field %q (names are case-sensitive)", m.Name)
				}
			}
			return refuse(m.Name, "unknown field %q", m.Name)
		}
		if m.Value == nil {
			return refuse(m.Name, "%s is null, which is no value for it: leave the member out for its default", m.Name)
		}
		if err := decodeMember(v.Field(i), m); err != nil {
			return err
		}
	}
	return nil
}

// decodeMember sets f, a request field of one of decodeDocument's types, to
// the member m's value, or refuses a value of another kind.
func decodeMember(f reflect.Value, m idempotency.Member) error {
	switch f.Interface().(type) {
	case string, *string:
		s, ok := m.Value.(string)
		if !ok {
			return refuse(m.Name, "%s must be %s, got %s", m.Name, describeType(f.Type()), kindOf(m.Value))
		}
		if f.Kind() == reflect.String {
			f.SetString(s)
		} else {
			f.Set(reflect.ValueOf(&s))
		}
	case *int64:
		n, ok := m.Value.(json.Number)
		if !ok {
			return refuse(m.Name, "%s must be %s, got %s", m.Name, describeType(f.Type()), kindOf(m.Value))
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return refuse(m.Name, "%s must be %s, got number %s", m.Name, describeType(f.Type()), n)
		}
		f.Set(reflect.ValueOf(&i))
	case *bool:
		b, ok := m.Value.(bool)
		if !ok {
			return refuse(m.Name, "%s must be %s, got %s", m.Name, describeType(f.Type()), kindOf(m.Value))
		}
		f.Set(reflect.ValueOf(&b))
	case map[string]string:
		object, ok := m.Value.([]idempotency.Member)
		if !ok {
			return refuse(m.Name, "%s must be %s, got %s", m.Name, describeType(f.Type()), kindOf(m.Value))
		}
		values := make(map[string]string, len(object))
		for _, e := range object {
			s, ok := e.Value.(string)
			if !ok {
				field := m.Name + "." + e.Name
				return refuse(field, "%s must be a string, got %s", field, kindOf(e.Value))
			}
			values[e.Name] = s
		}
		f.Set(reflect.ValueOf(values))
	case []string:
		list, ok := m.Value.([]any)
		if !ok {
			return refuse(m.Name, "%s must be %s, got %s", m.Name, describeType(f.Type()), kindOf(m.Value))
		}
		values := make([]string, len(list))
		for j, e := range list {
			s, ok := e.(string)
			if !ok {
				return refuse(m.Name, "%s[%d] must be a string, got %s", m.Name, j, kindOf(e))
			}
			values[j] = s
		}
		f.Set(reflect.ValueOf(values))
	default:
		panic("httpapi: request field " + m.Name + " has a type decodeDocument does not handle")
	}
	return nil
}

func fieldIndex(t reflect.Type, name string) int {
	for i := range t.NumField() {
		if jsonName(t.Field(i)) == name {
			return i
		}
	}
	return -1
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// kindOf names a parsed JSON value's kind as encoding/json's errors do.
func kindOf(v any) string {
	switch v.(type) {
	case []idempotency.Member:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}

func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer (minor units, within range)"
	case reflect.String:
		return "a string"
	case reflect.Map:
		return "an object of string values"
	case reflect.Slice:
		return "a list of strings"
	case reflect.Bool:
		return "a boolean (true or false)"
	default:
		return "a " + t.Kind().String()
	}
}
