package durable

import "time"

// Flush exposes one write of Run to the benchmarks, which measure a write
// without Run's ticker: the acks and spool changes since the last write,
// and, when collect, the removed containers whose time is up at now.
func Flush(s *Store, now time.Time, collect bool) error { return s.flush(now, collect) }
