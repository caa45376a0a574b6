package payment

import (
	"errors"
	"fmt"
)

// Errors the domain reports. The HTTP layer maps each to a problem type.
var (
	// ErrNotFound: the merchant has no such object.
	ErrNotFound = errors.New("not found")

	// ErrAccountNotFound: a charge names an account the merchant does not have.
	ErrAccountNotFound = errors.New("account not found")

	// ErrCurrencyMismatch: a charge's currency differs from its account's.
	ErrCurrencyMismatch = errors.New("currency does not match the account's")

	// ErrUnauthenticated: the API key is missing or unknown.
	ErrUnauthenticated = errors.New("unauthenticated")

	// ErrUnavailable: the database cannot be reached or is overloaded; nothing
	// was changed and the request may be retried.
	ErrUnavailable = errors.New("temporarily unavailable")
)

// ValidationError reports a request that breaks the rules on money or fields.
// It is found before anything is claimed or written.
type ValidationError struct {
	Field   string
	Message string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return fmt.Sprintf("%s: %s", e.Field, e.Message)
}

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Message: fmt.Sprintf(format, args...)}
}
