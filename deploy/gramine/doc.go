// Package gramine holds the Gramine SGX deployment of the Quarry
// Coordinator: the manifest template, the Makefile that builds, signs and
// runs the enclave, and README.md. It has no Go code of its own; its tests
// render the template as gramine-manifest would and check the security
// properties of the result, so that CI (which has neither SGX nor Gramine)
// catches a manifest that would weaken the enclave.
package gramine
