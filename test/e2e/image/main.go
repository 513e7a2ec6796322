// Command image is the only program in the end-to-end tests' container
// images. It is built static (CGO_ENABLED=0) and has two modes:
//
//	image pause                   sleep until SIGTERM or SIGINT, then exit 0
//	image work --sleep D --exit N sleep D (a Go duration), then exit with code N
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

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: image pause | image work --sleep D --exit N")
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
		code := fs.Int("exit", 0, "exit code")
		if err := fs.Parse(os.Args[2:]); err != nil {
			os.Exit(2)
		}
		timer := time.NewTimer(*sleep)
		select {
		case <-timer.C:
			os.Exit(*code)
		case <-stop:
		}
	default:
		fmt.Fprintf(os.Stderr, "image: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}
