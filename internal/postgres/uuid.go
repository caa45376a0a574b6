package postgres

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// afterConnect prepares every new connection of the pool: its type map
// encodes identifiers as registerUUID says.
func afterConnect(_ context.Context, c *pgx.Conn) error {
	registerUUID(c.TypeMap())
	return nil
}

// Identifiers go to PostgreSQL as their 16 bytes. uuid.UUID is a
// driver.Valuer, and pgx encodes a Valuer by formatting it as text, then
// parsing that text back into its own UUID type (a string, a scan plan, and
// an error made and dropped on the way, for every identifier of every
// statement): 8.7 % of the service's CPU in the card charges' profile
// (docs/benchmarks.md). registerUUID hands pgx the bytes instead; the value
// sent is the same, and a parameter of another type (text) still gets its
// text.
func registerUUID(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapUUIDEncodePlan}, m.TryWrapEncodePlanFuncs...)
}

func tryWrapUUIDEncodePlan(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if u, ok := value.(uuid.UUID); ok {
		return &uuidEncodePlan{}, pgtype.UUID{Bytes: u, Valid: true}, true
	}
	return nil, nil, false
}

// uuidEncodePlan encodes a uuid.UUID as the pgtype.UUID of its bytes.
type uuidEncodePlan struct{ next pgtype.EncodePlan }

func (p *uuidEncodePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *uuidEncodePlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode(pgtype.UUID{Bytes: value.(uuid.UUID), Valid: true}, buf)
}
