// Command coordinator runs the Quarry Coordinator.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/quarry-cc/quarry/internal/app"
	"github.com/quarry-cc/quarry/internal/backup"
	"github.com/quarry-cc/quarry/internal/buildinfo"
	"github.com/quarry-cc/quarry/internal/config"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitConfig  = 2
)

func main() {
	if len(os.Args) > 1 && backup.IsCommand(os.Args[1]) {
		os.Exit(backup.Main(os.Args[1], os.Args[2:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Getenv, os.Args[1:], os.Stdout, os.Stderr))
}

func run(getenv func(string) string, args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		fmt.Fprintf(stdout, "coordinator %s", buildinfo.Version())
		if c := buildinfo.Commit(); c != "" {
			fmt.Fprintf(stdout, " (commit %s)", c)
		}
		fmt.Fprintln(stdout)
		return exitOK
	}
	cfg, err := config.Load(getenv, args, stdout)
	if errors.Is(err, config.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "coordinator: invalid configuration:\n%v\n\nRun 'coordinator --help' for the settings.\n", err)
		return exitConfig
	}
	log := newLogger(cfg, stderr)
	startProfiler(log)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.CheckMigration {
		if err := app.CheckMigration(ctx, cfg, log, stdout); err != nil {
			log.Error("migration check", "error", err.Error())
			return exitFailure
		}
		return exitOK
	}

	a, err := app.New(ctx, cfg, log)
	if err != nil {
		log.Error("cannot start", "error", err.Error())
		return exitFailure
	}
	if err := a.Run(ctx); err != nil {
		msg := "stopped with an error"
		var se *app.StartError
		if errors.As(err, &se) { // store etcd: the start failed after listening
			msg = "cannot start"
		}
		log.Error(msg, "error", err.Error())
		return exitFailure
	}
	log.Info("stopped")
	return exitOK
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if cfg.DebugLogging {
		opts.Level = slog.LevelDebug
	}
	if cfg.DevMode {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
