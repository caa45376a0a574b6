package relay

// SetBeforeMark installs a hook that runs after a batch is published and
// before it is marked, standing in for a crash at that moment.
func (r *Relay) SetBeforeMark(f func() error) { r.beforeMark = f }

// SetPruneBatch sets how many events one delete of pruning takes at most.
func (r *Relay) SetPruneBatch(n int) { r.opts.PruneBatch = n }
