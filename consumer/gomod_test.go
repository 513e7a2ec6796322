package consumer_test

import (
	"bufio"
	"bytes"
	"go/version"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// ownGoFloor is the oldest Go whose language and standard library the
// module's own code compiles with: errors.AsType (schemas/schemastest) is
// new in 1.26, testing/synctest and sync.WaitGroup.Go in 1.25. The compiler
// and go vet's stdversion check hold the code to the go line; raise this
// when the code starts to need a newer Go.
const ownGoFloor = "1.26.0"

// TestGoLineIsTheOldestTheModuleNeeds: the go line of go.mod is the oldest
// Go the module needs, the newest of its dependencies' go lines and
// ownGoFloor, and no newer. A service module that imports consumer has its
// own go line raised to at least this one by go mod tidy, so a go line
// newer than needed (it was once 1.26.8) forces every downstream module up.
func TestGoLineIsTheOldestTheModuleNeeds(t *testing.T) {
	t.Parallel()
	gomod, err := exec.CommandContext(t.Context(), "go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	src, err := os.ReadFile(strings.TrimSpace(string(gomod)))
	if err != nil {
		t.Fatal(err)
	}
	goLine := ""
	for line := range strings.Lines(string(src)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			goLine = strings.TrimSpace(v)
		}
	}
	if goLine == "" {
		t.Fatalf("go.mod has no go line:\n%s", src)
	}

	var stderr bytes.Buffer
	list := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{if not .Main}}{{.GoVersion}} {{.Path}}{{end}}", "all")
	list.Stderr = &stderr
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, stderr.Bytes())
	}
	need, why := ownGoFloor, "the module's own code"
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		v, path, ok := strings.Cut(sc.Text(), " ")
		if ok && v != "" && version.Compare("go"+v, "go"+need) > 0 {
			need, why = v, path
		}
	}
	if goLine != need {
		t.Errorf("go.mod says go %s; the oldest Go the module needs is %s (for %s): set the go line to it", goLine, need, why)
	}
}
