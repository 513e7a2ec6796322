package cli

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
)

// LookPathIn returns exec.LookPath's search of the directories of path (a
// PATH value) rather than of the process's PATH, so that a command reads
// the environment it was given.
func LookPathIn(path string) func(string) (string, error) {
	return func(name string) (string, error) {
		for _, dir := range filepath.SplitList(path) {
			if p := filepath.Join(cmp.Or(dir, "."), name); IsExecutable(p) {
				return p, nil
			}
		}
		return "", fmt.Errorf("%s not found in PATH", name)
	}
}

// IsExecutable reports whether p is a file someone may execute.
func IsExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}
