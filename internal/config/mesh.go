package config

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// Connection limits of the Marble API (docs/http.md, "The Marble API").
const (
	// DefaultMeshMaxConnections is the default bound of the Marble API's
	// open connections.
	DefaultMeshMaxConnections = 256
	// DefaultMeshMaxConnectionsPerSource is the default bound of the
	// Marble API connections from one source (an IPv4 address or an IPv6
	// /64).
	DefaultMeshMaxConnectionsPerSource = 32
	// maxMeshConnections bounds the setting: each connection needs a file
	// descriptor and about 80 KiB of buffers.
	maxMeshConnections = 65536
)

// MeshConfig are the Marble API's connection limits.
type MeshConfig struct {
	// MaxConnections bounds the open connections.
	MaxConnections int
	// MaxConnectionsPerSource bounds the connections of one source; a
	// Marble connects once per activation, so this is how many Marbles
	// behind one address (a NAT, a node) may activate at the same time.
	MaxConnectionsPerSource int
}

// meshFlags are the Marble API settings as given.
type meshFlags struct{ max, perSource string }

// registerMesh adds the Marble API's settings to fs.
func registerMesh(fs *flag.FlagSet, env func(name, def string) string) *meshFlags {
	f := &meshFlags{}
	fs.StringVar(&f.max, "mesh-max-connections", env("QUARRY_MESH_MAX_CONNECTIONS", strconv.Itoa(DefaultMeshMaxConnections)),
		"most open connections of the Marble API; when it is full, a connection from a source holding fewer connections replaces the oldest of the source holding the most, others are closed (docs/http.md) [QUARRY_MESH_MAX_CONNECTIONS]")
	fs.StringVar(&f.perSource, "mesh-max-connections-per-source", env("QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE", strconv.Itoa(DefaultMeshMaxConnectionsPerSource)),
		"most open Marble API connections from one source (an IPv4 address or an IPv6 /64): how many Marbles behind one address may activate at once [QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE]")
	return f
}

// apply checks the settings and sets c.Mesh.
func (f *meshFlags) apply(c *Config) []error {
	var errs []error
	maxConns, err := strconv.Atoi(strings.TrimSpace(f.max))
	if err != nil || maxConns < 1 || maxConns > maxMeshConnections {
		errs = append(errs, fmt.Errorf("mesh-max-connections [QUARRY_MESH_MAX_CONNECTIONS]: %q is not a count between 1 and %d", f.max, maxMeshConnections))
	}
	per, err := strconv.Atoi(strings.TrimSpace(f.perSource))
	if err != nil || per < 1 || per > maxMeshConnections {
		errs = append(errs, fmt.Errorf("mesh-max-connections-per-source [QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE]: %q is not a count between 1 and %d", f.perSource, maxMeshConnections))
	} else if len(errs) == 0 && per > maxConns {
		errs = append(errs, fmt.Errorf("mesh-max-connections-per-source [QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE]: %d is more than mesh-max-connections (%d)", per, maxConns))
	}
	if len(errs) == 0 {
		c.Mesh = MeshConfig{MaxConnections: maxConns, MaxConnectionsPerSource: per}
	}
	return errs
}
