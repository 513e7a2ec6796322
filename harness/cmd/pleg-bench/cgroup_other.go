//go:build !linux

package main

import "errors"

type memCgroup struct{}

func newMemCgroup(string, int64) (*memCgroup, error) {
	return nil, errors.New("memory cgroups are Linux's")
}

func (c *memCgroup) wrap(exe string) (string, []string) { return exe, nil }
func (c *memCgroup) peak() (int64, error)               { return 0, nil }
func (c *memCgroup) oomKills() (int64, error)           { return 0, nil }
func (c *memCgroup) remove() error                      { return nil }
