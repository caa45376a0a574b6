package payment

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// NewAccount is the request to open an account.
type NewAccount struct {
	Currency    string
	Description *string
	Metadata    map[string]string
}

// Validate returns a *ValidationError naming the first field that breaks the rules.
func (n NewAccount) Validate() error {
	if err := ValidateCurrency("currency", n.Currency); err != nil {
		return err
	}
	return validateFreeForm(n.Description, n.Metadata)
}

// NewCharge is the request to charge an account.
type NewCharge struct {
	// AccountID is any account id, the all-zero one included (it names an
	// account that does not exist): the request says whether one was given.
	AccountID   uuid.UUID
	Amount      int64
	Currency    string
	Description *string
	Metadata    map[string]string
	// Authorize (capture=false) holds the amount until a capture, a void or
	// the hold's expiry, instead of taking it at once.
	Authorize bool
}

// Validate returns a *ValidationError naming the first field that breaks the rules.
func (n NewCharge) Validate() error {
	if err := ValidateAmount("amount", n.Amount); err != nil {
		return err
	}
	if err := ValidateCurrency("currency", n.Currency); err != nil {
		return err
	}
	return validateFreeForm(n.Description, n.Metadata)
}

// ValidateAmount checks that amount, in minor units, is within MinAmount..MaxAmount.
func ValidateAmount(field string, amount int64) error {
	if amount < MinAmount || amount > MaxAmount {
		return Invalid(field, "must be an integer from %d to %d (minor units), got %d", MinAmount, MaxAmount, amount)
	}
	return nil
}

// ValidateCurrency checks that code is an active uppercase ISO 4217 currency code.
func ValidateCurrency(field, code string) error {
	switch {
	case code == "":
		return Invalid(field, "is required")
	case !isCurrency(code):
		return Invalid(field, "must be an uppercase ISO 4217 currency code such as USD, got %q", code)
	}
	return nil
}

func validateFreeForm(description *string, metadata map[string]string) error {
	if description != nil && utf8.RuneCountInString(*description) > MaxDescriptionLength {
		return Invalid("description", "must be at most %d characters", MaxDescriptionLength)
	}
	// PostgreSQL text cannot hold U+0000; refuse it here, as a 400, rather
	// than fail in the database after the key is claimed.
	if description != nil && strings.ContainsRune(*description, 0) {
		return Invalid("description", "must not contain the NUL character (U+0000)")
	}
	if len(metadata) > MaxMetadataKeys {
		return Invalid("metadata", "must have at most %d keys", MaxMetadataKeys)
	}
	for k, v := range metadata {
		if n := utf8.RuneCountInString(k); n == 0 || n > MaxMetadataKeyLength {
			return Invalid("metadata", "keys must be 1 to %d characters", MaxMetadataKeyLength)
		}
		if utf8.RuneCountInString(v) > MaxMetadataValueLen {
			return Invalid("metadata."+k, "must be at most %d characters", MaxMetadataValueLen)
		}
		if strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) {
			return Invalid("metadata", "keys and values must not contain the NUL character (U+0000)")
		}
	}
	return nil
}

// ChargeAccount decides a charge against the account it names, which the caller
// holds locked: the single rule for every charge. The account is nil when the
// merchant has none by that id. A charge in another currency is refused; one
// the balance covers succeeds and takes its amount from a; one it does not
// cover fails with FailureInsufficientFunds and leaves a unchanged. Charges on
// one account are decided one after another, each against what the ones
// before it left available. An authorization (in.Authorize) is decided the
// same way, but holds its amount until at+holdFor instead of taking it.
func ChargeAccount(a *Account, id uuid.UUID, in NewCharge, at time.Time, holdFor time.Duration) (Charge, error) {
	switch {
	case a == nil:
		return Charge{}, ErrAccountNotFound
	case a.Currency != in.Currency:
		return Charge{}, fmt.Errorf("%w: the account holds %s, the charge is in %s", ErrCurrencyMismatch, a.Currency, in.Currency)
	}
	c := Charge{
		ID:          id,
		AccountID:   a.ID,
		Amount:      in.Amount,
		Currency:    in.Currency,
		Status:      ChargeSucceeded,
		Description: in.Description,
		Metadata:    nonNil(in.Metadata),
		CreatedAt:   at,
	}
	if a.Available() < in.Amount {
		c.Status, c.FailureCode = ChargeFailed, FailureInsufficientFunds
		return c, nil
	}
	if in.Authorize {
		expires := at.Add(holdFor).Truncate(time.Microsecond) // as PostgreSQL keeps it
		c.Status, c.ExpiresAt = ChargeAuthorized, &expires
		a.Held += in.Amount
		return c, nil
	}
	c.AmountCaptured = in.Amount
	a.Balance -= in.Amount
	return c, nil
}
