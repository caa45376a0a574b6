package benchrun

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Watch runs query (whole-number columns) on database every interval, as
// psql's \watch would, writing "unix_ms v1 v2 ..." lines to a file until
// Stop: the sessions busy during a storm, other users of a server.
type Watch struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// StartWatch connects and starts watching; it fails when it cannot connect.
func StartWatch(ctx context.Context, database, query, path string, interval time.Duration) (*Watch, error) {
	conn, err := pgx.Connect(ctx, database)
	if err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &Watch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer f.Close()
		defer conn.Close(context.WithoutCancel(ctx))
		for {
			if line, err := watchLine(ctx, conn, query); err == nil {
				fmt.Fprintln(f, line)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
	}()
	return w, nil
}

func watchLine(ctx context.Context, conn *pgx.Conn, query string) (string, error) {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	if !rows.Next() {
		return "", fmt.Errorf("no row: %w", rows.Err())
	}
	values, err := rows.Values()
	if err != nil {
		return "", err
	}
	fields := []string{fmt.Sprint(time.Now().UnixMilli())}
	for _, v := range values {
		fields = append(fields, fmt.Sprint(v))
	}
	return strings.Join(fields, " "), nil
}

// Stop ends the watch; the file is complete when it returns.
func (w *Watch) Stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}
