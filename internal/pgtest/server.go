package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

const (
	envDatabaseURL   = "PAYMENTS_TEST_DATABASE_URL"
	envImage         = "PAYMENTS_TEST_POSTGRES_IMAGE"
	defaultImage     = "postgres:16-alpine"
	dockerSocket     = "/var/run/docker.sock"
	localURL         = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	minServerVersion = 130000 // DROP DATABASE ... WITH (FORCE)

	// provisionTimeout bounds finding a server and migrating the template; it
	// includes pulling the image on a machine that has never run it.
	provisionTimeout = 5 * time.Minute
	healthTimeout    = 20 * time.Second
	connectTimeout   = 5 * time.Second
)

// server is a PostgreSQL server the tests may create databases on.
type server struct {
	adminURL    string
	description string       // which source, and where; never a password
	stop        func() error // stops what provision started; nil if nothing
}

// close stops the container the server runs in, if pgtest started one.
func (s *server) close() error {
	if s.stop == nil {
		return nil
	}
	return s.stop()
}

// provision finds a server in the order the package documentation gives.
func provision(ctx context.Context) (*server, error) {
	if u := os.Getenv(envDatabaseURL); u != "" {
		srv, err := connectServer(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", envDatabaseURL, err)
		}
		srv.description += " (" + envDatabaseURL + ")"
		return srv, nil
	}

	noEngine, err := useEngine(ctx)
	if noEngine == "" {
		if err != nil {
			return nil, err
		}
		return startContainer(ctx, image())
	}

	srv, err := connectServer(ctx, localURL)
	if err != nil {
		return nil, fmt.Errorf(`no PostgreSQL server for the integration tests; tried, in order:
  1. %s: not set (an admin URL of a server where the tests may CREATE DATABASE)
  2. testcontainers-go: %s
  3. PostgreSQL on 127.0.0.1:5432 as user postgres without a password: %w
Set %[1]s, start a Docker-compatible engine (Docker, or Podman's API with DOCKER_HOST), or start a local PostgreSQL`,
			envDatabaseURL, noEngine, err)
	}
	srv.description += " (local server; " + envDatabaseURL + " not set; " + noEngine + ")"
	return srv, nil
}

// useEngine reports whether to start a container. It returns a non-empty
// reason when there is no engine to use, and an error when there is one that
// was asked for (DOCKER_HOST) but does not answer.
func useEngine(ctx context.Context) (noEngine string, err error) {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		if _, err := os.Stat(dockerSocket); err != nil {
			return "no Docker engine: DOCKER_HOST not set and " + dockerSocket + " absent", nil
		}
	}
	err = engineHealth(ctx)
	switch {
	case err == nil:
		return "", nil
	case host != "":
		return "", fmt.Errorf("DOCKER_HOST=%s is set, but the Docker engine there does not answer testcontainers-go's health check: %w\n"+
			"Start the engine, or unset DOCKER_HOST to use %s or a PostgreSQL on 127.0.0.1:5432", host, err, envDatabaseURL)
	default:
		// A socket left behind by a stopped engine is common enough that the
		// local server is the reasonable next try; Main's line says why.
		return fmt.Sprintf("%s exists but the engine does not answer: %v", dockerSocket, err), nil
	}
}

// engineHealth asks testcontainers-go's default provider whether its engine
// answers.
func engineHealth(ctx context.Context) (err error) {
	// Provider construction panics on some broken setups (MustExtractDockerSocket).
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers-go: %v", r)
		}
	}()
	defer quietTestcontainers()()
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return err
	}
	defer func() { _ = p.Close() }() // Health closes it too; closing twice is harmless.
	return p.Health(ctx)
}

// image is the PostgreSQL image to run: PAYMENTS_TEST_POSTGRES_IMAGE, or the
// version production runs.
func image() string {
	if img := os.Getenv(envImage); img != "" {
		return img
	}
	return defaultImage
}

// startContainer starts a PostgreSQL container and waits until it accepts
// connections. Its stop function removes the container.
func startContainer(ctx context.Context, img string) (_ *server, err error) {
	logs := quietTestcontainers()
	defer func() {
		// testcontainers-go's progress lines only help when something failed.
		if out := logs(); err != nil && out != "" {
			err = fmt.Errorf("%w\ntestcontainers-go said:\n%s", err, out)
		}
	}()

	// Prepared transactions hold the event feed back like running ones, and a
	// test proves it (internal/postgres, TestPreparedTransactionHoldsEvents);
	// PostgreSQL allows none by default.
	ctr, err := postgres.Run(ctx, img, postgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs("-c", "max_prepared_transactions=8"))
	if err != nil {
		// Run returns a container that was created but never became ready; remove it.
		return nil, errors.Join(
			fmt.Errorf("testcontainers-go could not start a PostgreSQL container from image %s (set %s to use another image, or %s to use a server of your own): %w",
				img, envImage, envDatabaseURL, err),
			testcontainers.TerminateContainer(ctr))
	}
	stop := func() error {
		if err := testcontainers.TerminateContainer(ctr); err != nil {
			return fmt.Errorf("remove container %s: %w", shortID(ctr.GetContainerID()), err)
		}
		return nil
	}

	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("container address: %w", err), stop())
	}
	srv, err := connectServer(ctx, u)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("container %s: %w", shortID(ctr.GetContainerID()), err), stop())
	}
	srv.description = fmt.Sprintf("testcontainers started postgres container %s (image %s); %s",
		shortID(ctr.GetContainerID()), img, strings.TrimPrefix(srv.description, "using "))
	srv.stop = stop
	return srv, nil
}

// quietTestcontainers sends testcontainers-go's log to a buffer, so that a
// passing run prints only Main's line. The returned function restores the
// previous logger and returns what was logged. Containers keep the logger they
// were created with, so their stop messages go to the buffer too.
func quietTestcontainers() (restore func() string) {
	prev := tclog.Default()
	buf := &bufferLogger{}
	tclog.SetDefault(buf)
	return func() string {
		tclog.SetDefault(prev)
		return buf.String()
	}
}

// bufferLogger is a testcontainers-go logger that keeps what it is told.
type bufferLogger struct {
	mu  sync.Mutex
	buf strings.Builder
}

// Printf implements testcontainers-go's log.Logger.
func (l *bufferLogger) Printf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := fmt.Sprintf(format, v...)
	l.buf.WriteString("  " + strings.TrimRight(s, "\n") + "\n")
}

// String returns everything logged so far.
func (l *bufferLogger) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// connectServer checks that adminURL reaches a PostgreSQL server recent enough
// for pgtest and describes the server without its credentials.
func connectServer(ctx context.Context, adminURL string) (*server, error) {
	where, err := hostOf(adminURL)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	var version string
	var num int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('server_version_num')::int").Scan(&version, &num); err != nil {
		return nil, fmt.Errorf("server version: %w", err)
	}
	version, _, _ = strings.Cut(version, " ")
	if num < minServerVersion {
		return nil, fmt.Errorf("PostgreSQL %s at %s is too old: pgtest needs 13 or newer", version, where)
	}
	return &server{
		adminURL:    adminURL,
		description: fmt.Sprintf("using PostgreSQL %s at %s", version, where),
	}, nil
}

// parseURL parses a postgres:// URL. Its errors never quote the URL, which may
// hold a password.
func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("want a URL of the form postgres://user[:password]@host[:port]/database[?sslmode=...]")
	}
	return u, nil
}

// withDatabase returns adminURL with its database replaced by name.
func withDatabase(adminURL, name string) (string, error) {
	u, err := parseURL(adminURL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	u.RawPath = ""
	q := u.Query()
	if q.Has("dbname") {
		q.Del("dbname")
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}

// hostOf returns where adminURL points, host:port or a socket directory,
// without user or password.
func hostOf(adminURL string) (string, error) {
	u, err := parseURL(adminURL)
	if err != nil {
		return "", err
	}
	if u.Host != "" {
		return u.Host, nil
	}
	if h := u.Query().Get("host"); h != "" {
		return h, nil
	}
	return "the default socket", nil
}
