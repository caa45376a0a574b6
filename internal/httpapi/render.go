package httpapi

import (
	"encoding/json"
	"net/http"

	"payments/internal/idempotency"
)

// response is what a handler answers; for POSTs it is also what is stored under
// the idempotency key and replayed.
type response = idempotency.Response

// jsonResponse renders v as the response body. The encoding is deterministic
// (struct order, sorted map keys), so equal objects give equal bytes.
func jsonResponse(status int, location string, v any) (response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return response{}, err
	}
	return response{Status: status, Location: location, Body: append(body, '\n')}, nil
}

func created(location string, v any) (response, error) {
	return jsonResponse(http.StatusCreated, location, v)
}
