// Command image is the only program in the end-to-end tests' container
// images. It is built static (CGO_ENABLED=0) and has two modes:
//
//	image pause                   sleep until SIGTERM or SIGINT, then exit 0
//	image work --sleep D --exit N sleep D (a Go duration), then exit with code N
//	image work --until T --exit N sleep until T (RFC 3339, to the nanosecond),
//	                              then exit with code N: containers started
//	                              one after the other exit together
//	image hog                     allocate and touch memory, 4 MiB at a time,
//	                              until the kernel's OOM killer ends it
//
// A work container ends early, with code 0, on SIGTERM; SIGKILL ends it
// with 137 as the runtime reports it.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// hogged keeps what hog allocates reachable.
var hogged [][]byte

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: image pause | image work (--sleep D | --until T) --exit N | image hog")
		os.Exit(2)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	switch os.Args[1] {
	case "pause":
		<-stop
	case "work":
		fs := flag.NewFlagSet("work", flag.ExitOnError)
		sleep := fs.Duration("sleep", time.Second, "how long to run before exiting")
		until := fs.String("until", "", "when to exit (RFC 3339), instead of --sleep")
		code := fs.Int("exit", 0, "exit code")
		if err := fs.Parse(os.Args[2:]); err != nil {
			os.Exit(2)
		}
		if *until != "" {
			t, err := time.Parse(time.RFC3339Nano, *until)
			if err != nil {
				fmt.Fprintf(os.Stderr, "image: --until: %v\n", err)
				os.Exit(2)
			}
			*sleep = time.Until(t)
		}
		timer := time.NewTimer(*sleep)
		select {
		case <-timer.C:
			os.Exit(*code)
		case <-stop:
		}
	case "hog":
		for {
			b := make([]byte, 4<<20)
			for i := range b {
				b[i] = byte(i)
			}
			hogged = append(hogged, b)
			time.Sleep(time.Millisecond)
		}
	default:
		fmt.Fprintf(os.Stderr, "image: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}
