// Package grafana checks the Grafana dashboard that the Helm chart ships
// (deploy/kubernetes/chart/files/dashboard.json, docs/operations.md
// "Dashboard"): every PromQL expression parses with Prometheus' own parser,
// and every metric it uses is one a real Coordinator exports. It is a
// module of its own so that the Prometheus server module, which the parser
// lives in, stays out of the Coordinator's go.mod; the README's test
// command runs it.
package grafana
