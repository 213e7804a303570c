// Package kubernetes holds the Kubernetes deployment of the Quarry
// Coordinator: the Helm chart in chart/ and the plain manifests in plain/,
// generated from the chart with helm template. It has no Go code of its
// own; its tests run helm lint and helm template and check the rendered
// objects against the Coordinator's settings (config.Load), and that
// plain/ is up to date.
package kubernetes
