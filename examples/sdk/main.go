// Command sdk shows the Go SDK (package client): it prints a Coordinator's
// state and, as a manifest user, the named secrets.
//
//	sdk -coordinator localhost:4433 -root root.pem -cert bob.crt -key bob.key apikey
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/quarry-cc/quarry/client"
)

func main() {
	addr := flag.String("coordinator", "localhost:4433", "Coordinator address, host:port")
	rootFile := flag.String("root", "root.pem", "PEM file with the Coordinator's root certificate")
	certFile := flag.String("cert", "", "PEM file with a manifest user's certificate")
	keyFile := flag.String("key", "", "PEM file with its private key")
	flag.Parse()

	rootPEM, err := os.ReadFile(*rootFile)
	if err != nil {
		log.Fatal(err)
	}
	opts := []client.Option{client.WithRootPEM(rootPEM)}
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			log.Fatal(err)
		}
		opts = append(opts, client.WithClientCertificate(cert))
	}
	c, err := client.New(*addr, opts...)
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status, err := c.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d: %s\n", status.Code, status.Message)

	if flag.NArg() == 0 {
		return
	}
	secrets, err := c.GetSecrets(ctx, flag.Args()...)
	if client.IsUnauthorized(err) || client.IsForbidden(err) {
		log.Fatalf("not allowed to read %v: %v", flag.Args(), err)
	}
	if err != nil {
		log.Fatal(err)
	}
	for _, name := range flag.Args() {
		s := secrets[name]
		fmt.Printf("%s (%s): %x\n", name, s.Type, s.Private)
	}
}
