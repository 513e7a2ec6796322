package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memCgroup is a memory cgroup made under this process's own, with a hard
// limit, for one child: the DaemonSet's memory limit applied for real. It
// works where the process may create cgroups under its own (cgroup v1's
// memory hierarchy, or a cgroup v2 subtree with the memory controller
// delegated).
type memCgroup struct {
	dir string
	v2  bool
}

// newMemCgroup makes the cgroup name with limit bytes under this process's
// memory cgroup, or says why it cannot.
func newMemCgroup(name string, limit int64) (*memCgroup, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var v1Path, v2Path string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[1] == "":
			v2Path = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1Path = parts[2]
		}
	}
	c := &memCgroup{}
	limitFile := ""
	switch {
	case v1Path != "":
		c.dir, limitFile = filepath.Join("/sys/fs/cgroup/memory", v1Path, name), "memory.limit_in_bytes"
	case v2Path != "":
		c.dir, limitFile, c.v2 = filepath.Join("/sys/fs/cgroup", v2Path, name), "memory.max", true
	default:
		return nil, errors.New("no memory cgroup in /proc/self/cgroup")
	}
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("make memory cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		c.remove()
		return nil, fmt.Errorf("set memory cgroup limit: %w", err)
	}
	return c, nil
}

// wrap returns the command line that runs exe inside the cgroup from its
// first instruction: a shell moves itself in, then executes exe.
func (c *memCgroup) wrap(exe string) (string, []string) {
	return "/bin/sh", []string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$1"`, c.dir, exe}
}

// peak returns the cgroup's highest memory use: what the kernel charged to
// it, anonymous memory and page cache (the bbolt file's pages) alike.
func (c *memCgroup) peak() (int64, error) {
	file := "memory.max_usage_in_bytes"
	if c.v2 {
		file = "memory.peak"
	}
	return c.readInt(file)
}

// oomKills returns how many processes the kernel killed in the cgroup for
// want of memory.
func (c *memCgroup) oomKills() (int64, error) {
	file := "memory.oom_control"
	if c.v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(c.dir, file))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil // a kernel that does not count them
}

func (c *memCgroup) readInt(file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// remove removes the cgroup; its processes must have ended.
func (c *memCgroup) remove() error { return os.Remove(c.dir) }
