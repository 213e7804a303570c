// Command backend is the example Marble of docs/marbles.md that
// quarry-premain starts: it knows nothing of the activation and reads
// what the Coordinator issued from its environment. It serves HTTPS to
// Marbles of type frontend only (mutual TLS with the Marble certificates)
// and answers with the fingerprint of the secret both types share.
//
// Environment (rendered from the manifest): LISTEN_ADDR, BACKEND_KEY (hex,
// a per-Marble secret), SHARED_KEY (hex) and the MARBLE_PREDEFINED_*
// credentials.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/quarry-cc/quarry/marble"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("backend: ")
	creds, err := marble.CredentialsFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	// A per-Marble secret: the same for every start with the same UUID.
	fmt.Printf("backend: per-Marble key %s (UUID %s)\n", fingerprint(os.Getenv("BACKEND_KEY")), creds.UUID)

	srv := &http.Server{
		Addr:      os.Getenv("LISTEN_ADDR"),
		TLSConfig: creds.ServerTLSConfig("frontend"), // only frontend Marbles get in
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			peer, err := marble.PeerMarbleType(r.TLS)
			if err != nil {
				http.Error(w, err.Error(), http.StatusForbidden)
				return
			}
			fmt.Fprintf(w, "hello %s, the shared key is %s\n", peer, fingerprint(os.Getenv("SHARED_KEY")))
		}),
	}
	fmt.Printf("backend: listening on %s\n", srv.Addr)
	log.Fatal(srv.ListenAndServeTLS("", "")) // the certificate is in TLSConfig
}

// fingerprint returns the first bytes of SHA-256 of a hex secret, to show
// it without printing it.
func fingerprint(hexKey string) string {
	key, err := hex.DecodeString(hexKey)
	if err != nil || len(key) == 0 {
		log.Fatalf("not a hex key: %q", hexKey)
	}
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:6])
}
