package schemas

// Where pleg-bridge publishes unless configured otherwise (PLEG_STREAM,
// PLEG_SUBJECT_PREFIX). They are wire contract: a subscriber that is told
// nothing finds the events here, so the bridge, the consumer package and the
// command-line tools take them from this one place.
const (
	// DefaultStream is the JetStream stream name.
	DefaultStream = "PLEG"
	// DefaultSubjectPrefix is the first subject token: events are published
	// on pleg.<node>.<namespace>.<podUID>.<eventType> and the stream takes pleg.>.
	DefaultSubjectPrefix = "pleg"
)

// ArchiveSuffix makes the default name of the archive stream of
// PLEG_ARCHIVE_MAX_AGE from its event stream's: PLEG_ARCHIVE for PLEG.
const ArchiveSuffix = "_ARCHIVE"

// ArchiveName returns the default name of stream's archive.
func ArchiveName(stream string) string { return stream + ArchiveSuffix }
