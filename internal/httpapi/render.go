package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/exactlyonce/payments/internal/idempotency"
)

// response is what a handler answers; for POSTs it is also what is stored under
// the idempotency key and replayed.
type response = idempotency.Response

// jsonResponse renders v as the response body, ending in a newline. The
// encoding is deterministic (struct order, sorted map keys), so equal objects
// give equal bytes, and <, > and & are not escaped (json.Marshal would make
// each six bytes). Stored responses replay as they were stored.
func jsonResponse(status int, location string, v any) (response, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return response{}, err
	}
	return response{Status: status, Location: location, Body: buf.Bytes()}, nil
}

func created(location string, v any) (response, error) {
	return jsonResponse(http.StatusCreated, location, v)
}
