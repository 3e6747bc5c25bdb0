// Package k8s holds kiln's Kubernetes manifests: a kustomize base, overlays
// and components (see README.md). Its tests check them without a cluster.
//
// The check is split in two test binaries. This package's renders every
// overlay with kustomize, decodes every object strictly into the
// Kubernetes API types and resolves the references between them, then
// writes what the kiln containers run to GoldenFile (and fails when the
// file differs). cmdline/ parses those command lines with kiln's real CLI
// and asks the real daemons for the probes' paths. Two binaries, because
// kustomize links Go's plugin package, which makes the Go linker bind
// every dynamic symbol at start, while kiln's CLI links NVML, whose
// symbols are bound only once NVML is loaded.
package k8s

import (
	"encoding/json"
	"fmt"
	"os"
)

// GoldenFile is the file, relative to this package's directory, that
// lists what every overlay runs of kiln.
const GoldenFile = "testdata/kiln-containers.json"

// Golden is GoldenFile's content.
type Golden struct {
	Containers []KilnContainer `json:"containers"`
	// ScaleMetrics are the external metrics the autoscalers scale on.
	ScaleMetrics []string `json:"scale_metrics"`
}

// KilnContainer is one kiln container of an overlay: its command line as
// the kubelet runs it (the image's entrypoint and the container's args,
// $(VAR) references resolved), where its volumes are mounted, and its
// probes.
type KilnContainer struct {
	Overlay   string   `json:"overlay"`
	Where     string   `json:"where"`
	Target    string   `json:"target"`             // docker/Dockerfile's target its image is built from
	Replicas  int32    `json:"replicas,omitempty"` // a Deployment's or StatefulSet's (none: a DaemonSet)
	Argv      []string `json:"argv"`
	Mounts    []string `json:"mounts"`
	Liveness  *Probe   `json:"liveness"`
	Readiness *Probe   `json:"readiness"`
	GPUs      int64    `json:"gpus,omitempty"`
}

// Probe is an HTTP probe, its port resolved to a number.
type Probe struct {
	Path string `json:"path"`
	Port int    `json:"port"`
}

// ReadGolden reads a GoldenFile.
func ReadGolden(path string) (Golden, error) {
	var g Golden
	b, err := os.ReadFile(path)
	if err != nil {
		return g, err
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("%s: %w", path, err)
	}
	if len(g.Containers) == 0 {
		return g, fmt.Errorf("%s: no containers", path)
	}
	return g, nil
}
