// Command quarry-premain activates a Marble at the Coordinator and then
// execs the Marble's program: Quarry's replacement for MarbleRun's
// premain-libos, for Gramine enclaves (libos.entrypoint) and, in
// simulation, for plain processes.
//
// It reads MarbleRun's Marble variables (docs/design/behaviour.md#marble-side):
//
//	EDG_MARBLE_TYPE              the Marble's name in the manifest (required)
//	EDG_MARBLE_COORDINATOR_ADDR  the Coordinator's Marble API (default localhost:2001)
//	EDG_MARBLE_DNS_NAMES         comma-separated names for the certificate and CSR (default
//	                             localhost; entries are trimmed, empty ones skipped; IP addresses
//	                             become IP SANs; 127.0.0.1 and ::1 are always added)
//	EDG_MARBLE_UUID_FILE         the file holding the Marble's UUID (default ./uuid; created if absent)
//
// and Quarry's:
//
//	QUARRY_ATTESTATION              auto (default): Gramine DCAP quotes when
//	                                <dir>/attestation_type says dcap, else none
//	                                (simulation); gramine: Gramine quotes or fail;
//	                                simulation: no quote. OE_SIMULATION=1 means simulation.
//	QUARRY_GRAMINE_ATTESTATION_DIR  Gramine's attestation directory (default /dev/attestation),
//	                                the same variable as the Coordinator's
//	QUARRY_ACTIVATION_ATTEMPTS      attempts while the Coordinator is unreachable or not yet
//	                                accepting Marbles (default 10; 1 = once, as MarbleRun)
//	QUARRY_ACTIVATION_RETRY_DELAY   first wait between attempts, doubling up to 10s (default 1s)
//	QUARRY_COORDINATOR_ROOT         a PEM file holding the Coordinator root certificate alone:
//	                                pins the Coordinator (docs/trust.md)
//	QUARRY_COORDINATOR_ROOT_SHA256  the SHA-256 fingerprint of that certificate (64 hex digits,
//	                                colons allowed) instead; set at most one of the two
//	QUARRY_FILE_ROOTS               absolute directories, separated by ':', beneath which the
//	                                manifest's files with absolute paths are written (default:
//	                                "/" when the Coordinator is pinned, none otherwise)
//
// Production Marbles pin the Coordinator: the premain then accepts an
// answer only from a server that proves in the TLS handshake to hold the
// Coordinator's key, which no Marble certificate or certificate secret
// can. The root stays the same through updates and recovery. Under
// Gramine, put the pin where the enclave's measurement covers it
// (loader.env.QUARRY_COORDINATOR_ROOT_SHA256 in the manifest, or the PEM
// file among sgx.trusted_files), not in an environment the host passes
// in. Unpinned, as MarbleRun's premain, it says so on stderr and accepts
// whoever answers at EDG_MARBLE_COORDINATOR_ADDR, who then chooses the
// files written, the environment (LD_PRELOAD included) and the program
// exec'd.
//
// After activation it writes the Files (directories 0700, files 0600)
// with marble.Parameters.WriteFiles: relative paths beneath the working
// directory, absolute paths beneath the file roots, never through a
// symbolic link and never with "..". It then execs the program with the
// Argv from the manifest (["./marble"] if it has none) and its own
// environment with the manifest's Env (including the MARBLE_PREDEFINED_*
// variables) set over it. The program is, as with MarbleRun's
// premain-libos under Gramine, the premain's own argv[0] when that names
// an existing file other than the premain itself (Gramine's
// loader.argv0_override or loader.argv names the application while
// libos.entrypoint is the premain); otherwise Argv[0], looked up in the
// PATH of the new environment when it contains no slash.
//
// The premain's own arguments after argv[0] are not passed on: the
// program gets the manifest's Argv, as with MarbleRun's premain; the
// premain names ignored arguments on stderr, and likewise EDG_MARBLE_*
// variables other than the four above (a misspelt one would otherwise
// fall back to its default unnoticed).
//
// Exit status: 2 for a configuration error (the message names the
// variable), 1 when the activation fails or is refused (with the
// Coordinator's message) or the program cannot be started. On success the
// process becomes the program.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	self, err := os.Executable()
	if err != nil {
		self = ""
	}
	code := premain{
		environ: os.Environ(),
		args:    os.Args,
		stderr:  os.Stderr,
		exec:    syscall.Exec,
		self:    self,
	}.run(ctx)
	stop()
	os.Exit(code)
}
