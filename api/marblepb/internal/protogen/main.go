// Command protogen generates the Go code of package marblepb from
// marble.proto: it runs protoc with protoc-gen-go and protoc-gen-go-grpc at
// the versions pinned by the tool block of go.mod (built with `go tool -n`),
// so the output depends only on the module's own go.mod and on protoc.
//
// Usage (from go generate in api/marblepb, or from the staleness test):
//
//	go run ./internal/protogen [-out DIR]
//
// It writes marble.pb.go and marble_grpc.pb.go into DIR (default: the
// current directory, which go generate makes the package directory).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// protoFile is marble.proto's path relative to the module root. protoc is run
// with the module root as its only import path, so this path is also the
// name under which the file is registered in the protobuf registry: a
// name unlikely to clash with any other module's.
const protoFile = "api/marblepb/marble.proto"

// outputs are the files protoc writes for protoFile, relative to the module root.
var outputs = []string{
	"api/marblepb/marble.pb.go",
	"api/marblepb/marble_grpc.pb.go",
}

func main() {
	out := flag.String("out", ".", "directory to write the generated files to")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "protogen:", err)
		os.Exit(1)
	}
}

func run(outDir string) error {
	root, err := goOutput("", "env", "GOMOD")
	if err != nil {
		return err
	}
	if root == "" || root == os.DevNull {
		return errors.New("not inside a Go module")
	}
	root = filepath.Dir(root)

	protoc, err := exec.LookPath("protoc")
	if err != nil {
		return fmt.Errorf("protoc not found (Debian: apt-get install protobuf-compiler): %w", err)
	}
	genGo, err := goOutput(root, "tool", "-n", "protoc-gen-go")
	if err != nil {
		return err
	}
	genGRPC, err := goOutput(root, "tool", "-n", "protoc-gen-go-grpc")
	if err != nil {
		return err
	}

	tmp, err := os.MkdirTemp("", "protogen")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	cmd := exec.Command(protoc,
		"--proto_path=.",
		"--plugin=protoc-gen-go="+genGo,
		"--plugin=protoc-gen-go-grpc="+genGRPC,
		"--go_out="+tmp, "--go_opt=paths=source_relative",
		"--go-grpc_out="+tmp, "--go-grpc_opt=paths=source_relative",
		protoFile,
	)
	cmd.Dir = root
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("protoc: %w", err)
	}

	for _, name := range outputs {
		b, err := os.ReadFile(filepath.Join(tmp, filepath.FromSlash(name)))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(outDir, filepath.Base(name)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// goOutput runs the go command in dir and returns its trimmed standard output.
func goOutput(dir string, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
