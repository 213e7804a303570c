// Command testapp is a Marble program for tests: quarry-premain (or any
// premain) execs it after activation, and it reports what it got as JSON.
// It also talks mutual TLS with another instance using the credentials the
// Coordinator handed out, so tests can check that two Marbles trust each
// other.
//
// Usage:
//
//	testapp [flags] [FILE...]
//
// It prints one JSON line, the report, to stdout (or to -out):
//
//	{
//	  "argv":  ["testapp", ...],          // its whole command line
//	  "cwd":   "/work/dir",
//	  "env":   {"NAME": "value", "UNSET": null},
//	  "files": {"FILE": {"data": "<base64>", "mode": "0600"},
//	            "MISSING": {"error": "..."}},
//	  "listen":  "127.0.0.1:40123",       // -serve only: the bound address
//	  "connect": {...}                    // -connect only: see below
//	}
//
// Environment values are JSON strings (bytes that are not UTF-8 become
// U+FFFD); file contents are base64, modes octal permission bits.
//
// Flags:
//
//	-env NAMES     comma-separated variables to report; NAME* reports every
//	               variable starting with NAME (e.g. MARBLE_*)
//	-serve ADDR    server mode: listen on ADDR (port 0 for any) with TLS,
//	               answer -count connections, then exit
//	-count N       connections to answer in server mode (default 1)
//	-connect ADDR  client mode: connect to ADDR with TLS, send -message and
//	               report the answer under "connect"
//	-message TEXT  what the client sends (default "hello")
//	-tls MODE      credentials: "predefined" (default) uses
//	               MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN,
//	               MARBLE_PREDEFINED_PRIVATE_KEY and MARBLE_PREDEFINED_ROOT_CA,
//	               with client certificates required and verified; "ttls" uses
//	               MARBLE_TTLS_CONFIG: the server its Incoming entry "*:<port>"
//	               (client certificates required if clientAuth is true), the
//	               client its Outgoing entry "<ADDR>" of -connect
//	-timeout D     bound on the whole run, e.g. waiting for connections
//	               (default 60s)
//	-out FILE      write the report (and server lines) to FILE, not stdout
//	-exit N        exit status after a successful run (default 0)
//
// Server mode prints the report first (with "listen"), then one line per
// connection answered:
//
//	{"accepted": {"message": "hello", "client_cn": "<the client's CN>", "client_verified": true}}
//
// It answers the client with one JSON line {"message", "server_cn",
// "client_cn"}, which the client reports as
//
//	"connect": {"addr": ADDR, "server_cn": "<CN of the server certificate>",
//	            "reply": {"message": "hello", "server_cn": ..., "client_cn": ...}}
//
// A Marble's certificate has its UUID as CN. The client retries connecting
// until -timeout, so a client may start before its server. Failures go to
// stderr with exit status 1; bad flags give 2.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args, os.Environ(), os.Stdout, os.Stderr))
}
