// Command frontend is the example Marble of docs/marbles.md that activates
// itself with marble.Activate: it pins the Coordinator, applies the
// parameters, calls the backend Marble over mutual TLS, checks that both
// see the same shared secret, and counts its runs in a monotonic counter.
//
//	frontend -coordinator localhost:2001 -root root.pem -uuid-file frontend.uuid
//
// Exit status 3: the Coordinator refused the activation because the
// frontend type reached its MaxActivations.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/marble"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("frontend: ")
	coordinator := flag.String("coordinator", "localhost:2001", "the Coordinator's Marble API")
	rootFile := flag.String("root", "", "the Coordinator root certificate (PEM) to pin")
	uuidFile := flag.String("uuid-file", "frontend.uuid", "the file that keeps the Marble's UUID")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	params, err := marble.Activate(ctx, marble.Options{
		MarbleType:      "frontend",
		CoordinatorAddr: *coordinator,
		CoordinatorRoot: readRoot(*rootFile),
		UUIDFile:        *uuidFile,
		DNSNames:        []string{"localhost"},
	})
	switch {
	case marble.IsMaxActivations(err):
		fmt.Println("frontend: refused: frontend reached its MaxActivations")
		os.Exit(3)
	case marble.IsRefused(err):
		log.Fatalf("the Coordinator refused the activation: %v", err)
	case err != nil:
		log.Fatal(err) // unreachable or not pinned Coordinator
	}
	// Files and Env: this process now sees them as quarry-premain's
	// program would.
	if _, err := params.Apply(); err != nil {
		log.Fatal(err)
	}
	creds, err := params.Credentials()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("frontend: activated as %s\n", params.UUID)

	// Mutual TLS with the backend: it must be a backend Marble of this
	// Coordinator, and it sees that this is a frontend.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: creds.ClientTLSConfig("backend")}}
	resp, err := hc.Get("https://" + os.Getenv("BACKEND_ADDR") + "/")
	if err != nil {
		log.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		log.Fatal(err)
	}
	answer := strings.TrimSpace(string(body))
	fmt.Printf("frontend: the backend says: %s\n", strings.Split(answer, ",")[0])
	if want := "the shared key is " + fingerprint(os.Getenv("SHARED_KEY")); !strings.HasSuffix(answer, want) {
		log.Fatalf("the backend's shared key differs: %q, want %q", answer, want)
	}
	fmt.Println("frontend: the backend has the same shared key")

	// The file rendered with raw holds the same bytes as the variable
	// rendered with string.
	token, err := os.ReadFile("frontend/token")
	if err != nil || string(token) != os.Getenv("API_TOKEN") {
		log.Fatalf("frontend/token (%v) differs from API_TOKEN", err)
	}

	// The monotonic counter "runs" of this Marble (its type and UUID).
	clientAPI := os.Getenv("CLIENT_API")
	runs, err := creds.ReadMonotonicCounter(ctx, clientAPI, "runs")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := creds.MonotonicCounter(ctx, clientAPI, "runs", runs+1); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("frontend: run %d\n", runs+1)
}

// readRoot reads the pinned root certificate; nil without a file.
func readRoot(file string) *x509.Certificate {
	if file == "" {
		return nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		log.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		log.Fatalf("%s holds no PEM certificate", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		log.Fatal(err)
	}
	return c
}

func fingerprint(hexKey string) string {
	key, err := hex.DecodeString(hexKey)
	if err != nil || len(key) == 0 {
		log.Fatalf("not a hex key: %q", hexKey)
	}
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:6])
}
