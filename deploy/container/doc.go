// Package container checks the repository's Dockerfile (the Coordinator's
// and the quarry CLI's container images). It has no Go code of its own.
// No container engine runs in CI, so its test reads the Dockerfile, runs the
// exact go build lines of its build stage, checks that the binaries are
// static and start, and checks the final stages: non-root user, the seal
// directory as the volume, the exposed ports equal to the settings.
package container
