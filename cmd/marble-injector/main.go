// Command marble-injector runs the Marble injector, the mutating admission
// webhook that prepares Marble pods for the Coordinator
// (docs/deployment.md, "Marble injector"). Its flags are those of
// MarbleRun's marble-injector, so that its deployments keep working.
package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/quarry-cc/quarry/internal/buildinfo"
	"github.com/quarry-cc/quarry/internal/injector"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("marble-injector", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg injector.Config
	fs.StringVar(&cfg.CoordinatorAddr, "coordAddr", "coordinator-mesh-api.marblerun:2001", "the Coordinator's Marble API (host:port) that Marbles are given as EDG_MARBLE_COORDINATOR_ADDR")
	fs.StringVar(&cfg.ClusterDomain, "clusterDomain", "cluster.local", "the cluster's DNS domain, ending the Marbles' DNS names (EDG_MARBLE_DNS_NAMES)")
	fs.StringVar(&cfg.SGXResource, "sgxResource", injector.IntelEPC, "the SGX device plugin's EPC resource requested for Marble containers and tolerated: "+injector.IntelEPC+" (Intel; adds "+injector.IntelEnclave+" and "+injector.IntelProvision+"), "+injector.AzureEPC+" (Azure), "+injector.AlibabaEPC+" (Alibaba)")
	certFile := fs.String("tlsCertFile", "/etc/webhook/certs/tls.crt", "PEM certificate the webhook serves (re-read when it changes)")
	keyFile := fs.String("tlsKeyFile", "/etc/webhook/certs/tls.key", "PEM private key of -tlsCertFile")
	addr := fs.String("addr", ":8443", "HTTPS listen address of the webhook")
	version := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: marble-injector [flags]\n\nServes the Marble injector webhook (POST %s, GET %s) over HTTPS.\n\nFlags:\n", injector.PathMutate, injector.PathHealthz)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Fprintf(stdout, "marble-injector %s (commit %s)\n", buildinfo.Version(), orNone(buildinfo.Commit()))
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "marble-injector: unexpected arguments %q\n", fs.Args())
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	inj, err := injector.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "marble-injector: %v\n", err)
		return 2
	}
	certs, err := injector.NewCertReloader(*certFile, *keyFile)
	if err != nil {
		fmt.Fprintf(stderr, "marble-injector: %v\n", err)
		return 2
	}
	observe := func(resp *admissionv1.AdmissionResponse, err error) {
		switch {
		case err != nil:
			log.Warn("bad admission request", "error", err.Error())
		case !resp.Allowed:
			log.Warn("pod refused", "uid", string(resp.UID), "reason", resp.Result.Message)
		case resp.Patch != nil:
			log.Info("pod injected", "uid", string(resp.UID))
		}
	}
	srv := &http.Server{
		Addr:              *addr,
		Handler:           inj.Handler(observe),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	done := make(chan os.Signal, 1)
	signal.Notify(done, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-done
		srv.Close()
	}()
	log.Info("marble injector listening", "addr", *addr, "coordinator", cfg.CoordinatorAddr, "sgxResource", cfg.SGXResource,
		"version", buildinfo.Version(), "commit", buildinfo.Commit())
	if err := srv.ListenAndServeTLS("", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("serving", "error", err.Error())
		return 1
	}
	return 0
}

func orNone(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
