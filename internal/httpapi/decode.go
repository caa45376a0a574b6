package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"

	"payments/internal/idempotency"
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
	if p, ok := checkContentType(r.Header.Get("Content-Type")); !ok {
		s.writeProblem(w, p)
		return idempotency.Request{}, false
	}
	if r.ContentLength > MaxBodyBytes {
		s.writeProblem(w, tooLarge())
		return idempotency.Request{}, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.writeProblem(w, tooLarge())
		} else {
			s.writeProblem(w, newProblem(probInvalidRequest, "could not read the request body"))
		}
		return idempotency.Request{}, false
	}
	canonical, err := idempotency.Canonicalize(body)
	if err != nil {
		s.writeProblem(w, newProblem(probInvalidRequest, err.Error()))
		return idempotency.Request{}, false
	}
	if p, ok := decodeStrict(body, dst); !ok {
		s.writeProblem(w, p)
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
			s.writeProblem(w, newProblem(probInvalidRequest,
				"the path percent-encodes characters that need no encoding; send it as is (ids are plain ASCII)"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func tooLarge() problem {
	return newProblem(probTooLarge, fmt.Sprintf("the request body exceeds %d bytes", MaxBodyBytes))
}

// checkContentType accepts application/json, with no charset or UTF-8.
func checkContentType(ct string) (problem, bool) {
	mediaType, params, err := mime.ParseMediaType(ct)
	if err != nil || mediaType != "application/json" {
		return newProblem(probUnsupportedMedia, fmt.Sprintf("Content-Type must be application/json, got %q", ct)), false
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return newProblem(probUnsupportedMedia, fmt.Sprintf("the charset must be UTF-8, got %q", cs)), false
	}
	return problem{}, true
}

// decodeStrict decodes one JSON object into dst, refusing unknown fields and
// wrong types with a detail that names the field.
func decodeStrict(body []byte, dst any) (problem, bool) {
	// encoding/json matches member names case-insensitively, so {"amount":5,
	// "Amount":6} would decode by member order while its canonical form (and
	// so the fingerprint) ignores that order. Only exact names are accepted.
	if name, ok := inexactMember(body, dst); !ok {
		p := newProblem(probInvalidRequest, fmt.Sprintf("unknown field %q (names are case-sensitive)", name))
		p.Field = name
		return p, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil {
		return problem{}, true
	}
	var (
		typeErr *json.UnmarshalTypeError
		p       = newProblem(probInvalidRequest, "")
	)
	switch {
	case errors.As(err, &typeErr) && typeErr.Field == "":
		p.Detail = "the request body must be a JSON object, got " + typeErr.Value
	case errors.As(err, &typeErr):
		p.Field, p.Detail = typeErr.Field, fmt.Sprintf("%s must be %s, got %s", typeErr.Field, describeType(typeErr.Type), typeErr.Value)
		if key, ok := mapMember(body, dst, typeErr); ok {
			p.Field = typeErr.Field + "." + key
			p.Detail = fmt.Sprintf("%s must be %s, got %s", p.Field, describeType(typeErr.Type), typeErr.Value)
		}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		p.Field = name
		p.Detail = fmt.Sprintf("unknown field %q", name)
	default:
		p.Detail = "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: ")
	}
	return p, false
}

// inexactMember returns the first top-level member of a JSON object body whose
// name is not exactly one of dst's fields, and false. Anything but an object
// passes, for the decoder to refuse with its own message.
func inexactMember(body []byte, dst any) (string, bool) {
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return "", true
	}
	t := reflect.TypeOf(dst).Elem()
	for name := range members {
		known := false
		for i := range t.NumField() {
			if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); tag == name {
				known = true
				break
			}
		}
		if !known {
			return name, false
		}
	}
	return "", true
}

// mapMember names the member at fault when typeErr is about a value inside a
// map field of dst (metadata): encoding/json names only the field. It reports
// the first member, in document order, that does not decode.
func mapMember(body []byte, dst any, typeErr *json.UnmarshalTypeError) (string, bool) {
	t := reflect.TypeOf(dst).Elem()
	var field reflect.Type
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); tag == typeErr.Field {
			field = t.Field(i).Type
		}
	}
	if field == nil || field.Kind() != reflect.Map || field.Elem() != typeErr.Type {
		return "", false
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(members[typeErr.Field]))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		tok, err := dec.Token()
		key, isKey := tok.(string)
		var value json.RawMessage
		if err != nil || !isKey || dec.Decode(&value) != nil {
			return "", false
		}
		if json.Unmarshal(value, reflect.New(typeErr.Type).Interface()) != nil {
			return key, true
		}
	}
	return "", false
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
	default:
		return "a " + t.Kind().String()
	}
}
