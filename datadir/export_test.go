package datadir

import (
	"time"

	bolt "go.etcd.io/bbolt"
)

// Flush exposes one write of Run to the benchmarks, which measure a write
// without Run's ticker: the acks and spool changes since the last write,
// and, when collect, the removed containers whose time is up at now.
func Flush(s *Store, now time.Time, collect bool) error { return s.flush(now, collect) }

// CommittedTx returns the ID of the store's last committed write
// transaction: the difference over a flush counts its transactions.
func CommittedTx(s *Store) int {
	var id int
	_ = s.db.View(func(tx *bolt.Tx) error {
		id = int(tx.ID())
		return nil
	})
	return id
}

// PagesWritten returns the pages the store's write transactions have
// written to the file so far (one write system call each).
func PagesWritten(s *Store) int64 {
	st := s.db.Stats()
	return st.TxStats.GetWrite()
}
