// Added to package sigs.k8s.io/kwok/pkg/kwok/server of a temporary copy of the kwok module
// at build time (see hack/build-control-plane.sh).

package server

import (
	"errors"
	osexec "os/exec"

	utilexec "k8s.io/utils/exec"
)

// tensileExitCode turns the local command's exit status into the error type the streaming
// server looks for. Local exec returns a wrapped *os/exec.ExitError, but the remote-command
// server only reports a NonZeroExitCode status (and so kubectl only exits with the command's
// code) for an error that is a k8s.io/utils/exec.ExitError itself.
func tensileExitCode(err error) error {
	var exitErr *osexec.ExitError
	if errors.As(err, &exitErr) && exitErr.Exited() {
		return utilexec.CodeExitError{Err: err, Code: exitErr.ExitCode()}
	}
	return err
}
