package main

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// version and commit are stamped at build time where the build has no VCS
// information (the Dockerfile's build copies the tree without .git):
//
//	-ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)"
//
// Unset, they are read from the build info: the main module's version and
// the vcs.revision and vcs.modified that `go build` stamps in a checkout.
var (
	version = ""
	commit  = ""
)

func versionString() string { return cmp.Or(version, publish.BuildVersion()) }

// commitString is the VCS commit the binary was built from: main.commit,
// else the build info's vcs.revision with "-dirty" when the tree had
// changes, else "unknown".
func commitString() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" && modified == "true" {
		rev += "-dirty"
	}
	return cmp.Or(rev, "unknown")
}

// versionLine is what version and --version print, without a newline: the
// version, the commit, the wire contract version (schemas.ContractVersion,
// which the events' dataschema and the stream's metadata carry) and the
// format of the durable state in the data directory (datadir.FormatVersion)
// that this build writes, then the Go version and the platform.
func versionLine() string {
	return fmt.Sprintf("pleg-bridge %s (commit %s, contract %s, data directory format %s, %s, %s/%s)",
		versionString(), commitString(), schemas.ContractVersion, datadir.FormatVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
