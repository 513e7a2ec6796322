package proc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// ReadUsage reads a process's resident memory now and at its peak (VmRSS,
// VmHWM of /proc/<pid>/status) and the CPU time it used, user and system
// (utime + stime of /proc/<pid>/stat).
func ReadUsage(pid int) (Sample, error) {
	var s Sample
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read process %d: %w", pid, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return s, fmt.Errorf("read process %d: %s: %w", pid, name, err)
		}
		if name == "VmRSS" {
			s.RSS = kb << 10
		} else {
			s.PeakRSS = kb << 10
		}
	}
	if s.PeakRSS == 0 {
		// An exited process not reaped yet keeps its status file, without
		// any memory: that is no sample.
		return s, fmt.Errorf("read process %d: no memory figures, it has exited", pid)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("read process %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: count the fields
	// after its closing one, where the state (field 3) comes first.
	i := bytes.LastIndexByte(stat, ')')
	f := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(f) < 13 {
		return s, fmt.Errorf("read process %d: stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, fmt.Errorf("read process %d: stat: utime %q, stime %q", pid, f[11], f[12])
	}
	s.CPU = time.Duration(utime+stime) * time.Second / clockTicks
	return s, nil
}
