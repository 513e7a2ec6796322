package cri

import "google.golang.org/grpc"

// ConnOf exposes the client's connection to the external tests, which call
// methods the client itself never makes (to show they are refused).
func ConnOf(c *Client) *grpc.ClientConn { return c.conn }
