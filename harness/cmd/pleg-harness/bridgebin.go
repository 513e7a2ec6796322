package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

// bridgeBinaryEnv names the pleg-bridge binary the soak runs. pleg-bridge
// soak sets it to itself when it hands over to this command, so that the
// soak runs the very binary it was asked through.
const bridgeBinaryEnv = "PLEG_BRIDGE_BINARY"

// bridgePackage is the agent's command, built when no binary is given.
const bridgePackage = "github.com/pleg-bridge/pleg-bridge/cmd/pleg-bridge"

// buildBridge builds the agent from the checkout the working directory is
// in, into dir, with the go command on the environment's PATH, and returns
// the binary's path. Its error says how to do without.
func buildBridge(ctx context.Context, env commandEnv, dir string) (string, error) {
	goCmd, err := cli.LookPathIn(env.getenv("PATH"))("go")
	if err != nil {
		return "", fmt.Errorf("no pleg-bridge binary to soak: give --bridge-binary or $%s, or run this from a checkout of pleg-bridge with go on PATH (%w)", bridgeBinaryEnv, err)
	}
	out := filepath.Join(dir, "pleg-bridge")
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", out, bridgePackage)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the pleg-bridge binary to soak (give --bridge-binary or $%s to use one already built): go build %s: %w: %s",
			bridgeBinaryEnv, bridgePackage, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
