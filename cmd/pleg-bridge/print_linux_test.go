package main

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// openTerminal returns the terminal side of a new pseudo-terminal.
func openTerminal(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to test --color auto on: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pseudo-terminal number: %v", err)
	}
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pseudo-terminal %d: %v", n, err)
	}
	t.Cleanup(func() { tty.Close() })
	return tty
}

func TestColorAutoOnATerminal(t *testing.T) {
	t.Parallel()
	tty := openTerminal(t)
	tests := []struct {
		name string
		env  map[string]string
		want bool
	}{
		{name: "a terminal gets colour", want: true},
		{name: "NO_COLOR turns it off", env: map[string]string{"NO_COLOR": "1"}},
		{name: "an empty NO_COLOR does not", env: map[string]string{"NO_COLOR": ""}, want: true},
		{name: "a dumb terminal gets none", env: map[string]string{"TERM": "dumb"}},
	}
	for _, tt := range tests {
		got, err := useColor("auto", tty, func(k string) string { return tt.env[k] })
		if err != nil || got != tt.want {
			t.Errorf("%s: useColor(auto) = %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
}
