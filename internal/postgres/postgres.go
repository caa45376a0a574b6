// Package postgres implements the payment ledger and the idempotency store on
// PostgreSQL with pgx, and turns driver errors into domain errors at its
// boundary. It holds the SQL the service runs on its data, with two
// exceptions: the worked-example consumer owns its tables and their SQL
// (internal/consumer/inbox.go), and the schema is in migrations, which
// cmd/payments runs (creating the database first if it is missing).
//
// Isolation: transactions run at READ COMMITTED. That suffices because no
// decision is ever made from a value that another transaction may still change:
// a key is decided under its advisory lock, held by whichever transaction
// writes the key's row (and the unique index backs that up); a charge is
// decided from its account read FOR UPDATE (chargesql.go); a deposit is a single
// UPDATE that PostgreSQL re-evaluates against the newest committed row version
// after waiting for its lock; and a refund, a capture or a void is decided
// from its charge read FOR UPDATE after its account was locked (ledger.go),
// in a statement of its own, so it reads the newest versions of both. The
// holds a decision counts (live authorizations) are read likewise, in a
// statement after the account's lock (chargesql.go). CHECK constraints
// (balance >= 0, held >= 0, amount_refunded <= amount_captured <= amount)
// back that up.
// Stricter levels would add serialization failures without preventing any
// anomaly this schema can have; deadlocks and serialization failures are still
// retried, never surfaced (the charge path's retries are internal/charging's,
// told by chargedb.ErrConflict). The lock order is written down in
// internal/charging/charging.go.
package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/singleflight"

	"github.com/exactlyonce/payments/internal/payment"
)

// Options tune a Store. Zero values take the defaults.
type Options struct {
	// MaxConns caps the connection pool (default 20).
	MaxConns int32
	// KeyWait is every connection's lock_timeout (default 5s): it bounds each
	// lock wait, above all a request's wait behind another transaction, on
	// any replica, holding its idempotency key. AcquireWait bounds the wait
	// for a pooled connection (acquire), LookupWait an API key's lookup, with
	// its wait for a budget and a slot (auth.go); zero takes KeyWait.
	KeyWait, AcquireWait, LookupWait time.Duration
	// KeyTTL is how long idempotency keys are kept (default 24h). An older key
	// that the janitor has not yet removed is treated as absent.
	KeyTTL time.Duration
	// CommitWait bounds a commit's wait for the synchronous standby (default
	// 5s); a commit the standby has not confirmed by then is not acknowledged
	// (durable.go).
	CommitWait time.Duration
	// KeyBudget limits each client address's lookups of API keys this
	// process has not seen (unknownkeys.go); zero fields take
	// DefaultKeyBudget's.
	KeyBudget KeyBudget
}

func (o Options) withDefaults() Options {
	if o.MaxConns <= 0 {
		o.MaxConns = 20
	}
	if o.KeyWait <= 0 {
		o.KeyWait = 5 * time.Second
	}
	o.AcquireWait, o.LookupWait = cmp.Or(o.AcquireWait, o.KeyWait), cmp.Or(o.LookupWait, o.KeyWait)
	if o.KeyTTL <= 0 {
		o.KeyTTL = 24 * time.Hour
	}
	if o.CommitWait <= 0 {
		o.CommitWait = 5 * time.Second
	}
	o.KeyBudget = o.KeyBudget.withDefaults()
	return o
}

// Store is the PostgreSQL side of the service, one role per type, each with
// its SQL in its own files, over one pool: Keys (idempotency.go, and ledger.go
// for the ledger its steps run on), ChargeDB (chargedb.go, chargesql.go and
// chargewrite.go: the SQL of the charge path, whose use case is
// internal/charging), Reader (reader.go), Outbox (outbox.go), Merchants
// (merchants.go, auth.go), Holds (holds.go), Webhooks (webhooks.go),
// Deliveries (deliveries.go), Cards (cards.go, cardsql.go: the SQL of
// card charges, whose use case is internal/cards) and Reconciliations
// (reconcile.go, for payments reconcile). Each role is built alone on the handle (DB,
// from Connect) with its New function, and holds no Close: the handle's
// owner closes it. Store bundles them for cmd/payments, which hands each
// consumer of the store the interface it declares. Monitor (monitor.go)
// reads the outbox for the metrics on a pool of its own.
type Store struct {
	*DB
	*Keys
	*ChargeDB
	*Reader
	*Outbox
	*Merchants
	*Holds
	*Webhooks
	*Deliveries
	Cards *CardDB // named: its methods (BeginKeyed, Claim, ...) would clash
	// Reconciliations is payments reconcile's (reconcile.go).
	Reconciliations *Reconciliations
}

// DB is the handle every role is built on: one pool, its options, and the
// notifier that wakes the relay after events commit. Connect opens it; Close
// closes it, and only its owner does: the roles do not have Close.
type DB struct{ *db }

// db is what the roles share through the handle: the pool, the options, the
// notifier, and the helpers every role's SQL uses (inTx, acquire, ...).
type db struct {
	pool *pgxpool.Pool
	opts Options

	// notify carries "events committed" to the notifier goroutine; its buffer
	// of one folds a burst of commits into one NOTIFY.
	notify       chan struct{}
	stopNotifier context.CancelFunc
	notifierDone chan struct{}

	// keyUses are the API keys' last uses still to write (keyuse.go), by
	// recordKeyUses, which closes keyUsesDone when it ends.
	keyUses     keyUses
	keyUsesDone chan struct{}

	// watchers are the channels watchEvents handed out, copied on write:
	// eventsCommitted reads them without a lock.
	watchers   atomic.Pointer[[]chan struct{}]
	watchersMu sync.Mutex

	// readSlots bounds the reads holding a pooled connection at once to
	// half the pool (acquireRead).
	readSlots chan struct{}

	// confirmed runs the rounds that confirm what reads show (confirmed.go,
	// rounds.go).
	confirmed confirmer
}

// Keys answers the statements of keyed writes on the ledger
// (idempotency.Store; the algorithm is idempotency.Keys) and expires keys.
type Keys struct{ *db }

// Reader reads a merchant's objects.
type Reader struct{ *db }

// Outbox hands the relay its lease on the outbox, and measures the backlog.
type Outbox struct{ *db }

// Merchants creates merchants and their API keys, and authenticates keys.
type Merchants struct {
	*db
	auth authCache
	// unknown remembers keys found unknown or revoked, budget limits each
	// client's lookups of keys not known, unknownSlots bounds such lookups
	// at once, and authFlight folds concurrent lookups of one key into one
	// (auth.go, unknownkeys.go).
	unknown      unknownHashes
	budget       failureBudget
	unknownSlots chan struct{}
	authFlight   singleflight.Group
}

// Open connects to the database at databaseURL (Connect) and builds every
// role on that one handle. It does not wait for the database to answer; use
// Ping for that.
func Open(ctx context.Context, databaseURL string, opts Options) (*Store, error) {
	d, err := Connect(ctx, databaseURL, opts)
	if err != nil {
		return nil, err
	}
	return &Store{
		DB:         d,
		Keys:       NewKeys(d),
		ChargeDB:   NewChargeDB(d),
		Reader:     NewReader(d),
		Outbox:     NewOutbox(d),
		Merchants:  NewMerchants(d),
		Holds:      NewHolds(d),
		Webhooks:   NewWebhooks(d),
		Deliveries: NewDeliveries(d),
		Cards:      NewCardDB(d),

		Reconciliations: NewReconciliations(d),
	}, nil
}

// Connect opens the handle the roles are built on: a pool on the database at
// databaseURL, and the notifier. It does not wait for the database to answer.
func Connect(ctx context.Context, databaseURL string, opts Options) (*DB, error) {
	opts = opts.withDefaults()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = opts.MaxConns
	// lock_timeout bounds every lock wait, above all the wait of a duplicate
	// request on the idempotency key's unique index behind an in-flight twin.
	// Rounded up: a lock_timeout of 0 would mean no bound at all.
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(int64((opts.KeyWait+time.Millisecond-1)/time.Millisecond), 10)
	cfg.ConnConfig.RuntimeParams["application_name"] = "payments"
	cfg.ConnConfig.OnNotice = onNotice
	cfg.AfterConnect = afterConnect
	// After a failover the old primary comes back as a standby. A connection
	// to it (every host of a multi-host DATABASE_URL with
	// target_session_attrs=read-write is checked when connecting, not after)
	// is closed when released rather than used again: PostgreSQL reports
	// in_hot_standby whenever it changes.
	cfg.AfterRelease = func(c *pgx.Conn) bool { return c.PgConn().ParameterStatus("in_hot_standby") != "on" }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	d := &db{pool: pool, opts: opts, notify: make(chan struct{}, 1), notifierDone: make(chan struct{}),
		readSlots: make(chan struct{}, max(1, opts.MaxConns/2)),
		keyUses:   keyUses{wake: make(chan struct{}, 1)}, keyUsesDone: make(chan struct{}),
		confirmed: confirmer{txSQL: confirmTxSQL, ended: make(chan struct{}, 1), asked: make(chan struct{}, 1), done: make(chan struct{})}}
	var background context.Context
	background, d.stopNotifier = context.WithCancel(context.Background())
	go d.notifier(background)
	go d.recordKeyUses(background)
	go d.confirmRounds(background)
	return &DB{d}, nil
}

// NewKeys builds the Keys role on d.
func NewKeys(d *DB) *Keys { return &Keys{d.db} }

// NewChargeDB builds the charge path's store on d.
func NewChargeDB(d *DB) *ChargeDB { return &ChargeDB{db: d.db, chargeSQL: defaultChargeStatements} }

// NewReader builds the Reader role on d.
func NewReader(d *DB) *Reader { return &Reader{d.db} }

// NewOutbox builds the Outbox role on d.
func NewOutbox(d *DB) *Outbox { return &Outbox{d.db} }

// NewMerchants builds the Merchants role on d.
func NewMerchants(d *DB) *Merchants {
	return &Merchants{db: d.db, budget: failureBudget{limits: d.opts.KeyBudget}, unknownSlots: make(chan struct{}, UnknownKeyLookups)}
}

// Close ends the background work (a confirmation round waiting for the
// standby included: rounds.go), waits for connections in use to be released
// and closes the pool.
func (s *DB) Close() {
	s.stopNotifier()
	<-s.notifierDone
	<-s.keyUsesDone
	<-s.confirmed.done
	s.pool.Close()
}

// eventsCommitted tells the relay, wherever it runs, that events committed.
// It never blocks: a NOTIFY already pending covers this commit too.
// It wakes this process's watchers (watchEvents) the same way.
func (s *db) eventsCommitted() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
	if w := s.watchers.Load(); w != nil {
		for _, c := range *w {
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}
}

// watchEvents returns a channel that receives soon after this process
// commits events (one signal pending covers the commits after it; commits of
// other processes do not send), and a func that ends the watch.
func (s *db) watchEvents() (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	s.watchersMu.Lock()
	defer s.watchersMu.Unlock()
	s.setWatchers(append(s.currentWatchers(), c))
	return c, func() {
		s.watchersMu.Lock()
		defer s.watchersMu.Unlock()
		s.setWatchers(slices.DeleteFunc(s.currentWatchers(), func(w chan struct{}) bool { return w == c }))
	}
}

// currentWatchers copies the watchers, for a change under watchersMu.
func (s *db) currentWatchers() []chan struct{} {
	if w := s.watchers.Load(); w != nil {
		return slices.Clone(*w)
	}
	return nil
}

func (s *db) setWatchers(w []chan struct{}) { s.watchers.Store(&w) }

// notifier sends NOTIFY payments_events, once per burst of commits. The NOTIFY
// runs in its own tiny transaction, after the business transactions: a NOTIFY
// inside them would make their commits queue on a database-wide lock. If it is
// lost (the process dies first), the relay's polling finds the events.
func (s *db) notifier(ctx context.Context) {
	defer close(s.notifierDone)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.notify:
		}
		_, err := s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, notifyChannel)
		s.transactionEnded() // a NOTIFY takes a transaction id
		if err != nil && ctx.Err() == nil {
			// The relay polls as well; an outage only delays it.
			continue
		}
		// At most one NOTIFY per notifyEvery: under load the relay is woken
		// often enough to publish in batches, not once per commit.
		select {
		case <-ctx.Done():
			return
		case <-time.After(notifyEvery):
		}
	}
}

// notifyEvery paces the notifier; it bounds the delay it adds to an event's
// publication.
const notifyEvery = 10 * time.Millisecond

// Pool exposes the connection pool for statistics and tests.
func (s *DB) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that the database answers and takes writes: a primary, not a
// standby. It returns payment.ErrUnavailable when it does not.
func (s *DB) Ping(ctx context.Context) error { return s.ping(ctx) }

// Ping is the handle's (DB.Ping): the charge path's store has one too.
func (s *Store) Ping(ctx context.Context) error { return s.DB.Ping(ctx) }

func (s *db) ping(ctx context.Context) error {
	var standby bool
	if err := s.pool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil {
		return asUnavailable(fmt.Errorf("ping: %w", err))
	}
	if standby {
		return fmt.Errorf("%w: the database is a standby, not a primary", payment.ErrUnavailable)
	}
	return nil
}

// inTx runs fn in a transaction on a pooled connection (see acquire). fn's
// error rolls the transaction back. The commit is acknowledged only when the
// synchronous standby, if any, confirmed it (durable.go).
func (s *db) inTx(ctx context.Context, fn func(pgx.Tx) error) (err error) {
	conn, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	defer s.transactionEnded()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		rollbackCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tx.Rollback(rollbackCtx) // if it fails, Release closes the connection
		return err
	}
	return s.durably(ctx, conn.Conn().PgConn(), func(commitCtx context.Context) error { return tx.Commit(commitCtx) })
}

// acquire takes a pooled connection, waiting at most AcquireWait for one: a
// pool that stays exhausted is payment.ErrUnavailable, not an unbounded queue.
// acquireRead is acquire for a read (read, readRow), which also takes one
// of the pool's read slots, half its connections, first: reads, however
// many merchants make them, never hold the connections that charges,
// captures and refunds need (one pool, two kinds). The wait for a slot is
// bounded by AcquireWait, as the wait for the connection is. release gives
// both back.
func (s *db) acquireRead(ctx context.Context) (conn *pgxpool.Conn, release func(), err error) {
	wait, cancel := context.WithTimeout(ctx, s.opts.AcquireWait)
	defer cancel()
	select {
	case s.readSlots <- struct{}{}:
	case <-wait.Done():
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, fmt.Errorf("acquire a connection for a read: %w: the %d connections reads may hold are busy",
			payment.ErrUnavailable, cap(s.readSlots))
	}
	if conn, err = s.acquire(ctx); err != nil {
		<-s.readSlots
		return nil, nil, err
	}
	return conn, func() { conn.Release(); <-s.readSlots }, nil
}

func (s *db) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	acquireCtx, cancel := context.WithTimeout(ctx, s.opts.AcquireWait)
	defer cancel()
	conn, err := s.pool.Acquire(acquireCtx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("acquire connection: %w: %w", payment.ErrUnavailable, err)
	}
	return conn, nil
}
