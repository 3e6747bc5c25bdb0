// Package k8s_test checks kiln's Kubernetes manifests without a cluster:
// every overlay is rendered with kustomize and every object decoded
// strictly into the Kubernetes API types; references between objects
// (Secrets, ConfigMaps, volumes, ports, selectors, autoscaling targets)
// must resolve; each kiln container's image must be a docker/Dockerfile
// target as docker/build.sh names it. What the kiln containers run is
// written to testdata/kiln-containers.json, which cmdline/ parses with
// kiln's real CLI and probes on the real daemons.
package k8s_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kiln-ml/kiln/deploy/k8s"
	"github.com/kiln-ml/kiln/internal/check"
)

// operatorSecrets are the Secrets the manifests use but do not make: the
// operator creates them (deploy/k8s/README.md says how).
var operatorSecrets = map[string][]string{
	"kiln-token":       {"token"},
	"kiln-tls":         {"tls.crt", "tls.key", "ca.crt"},
	"kiln-etcd-client": {"ca.crt", "tls.crt", "tls.key"},
	"kiln-etcd-tls":    {"ca.crt", "tls.crt", "tls.key"},
	"kiln-s3":          {"access-key-id", "secret-access-key"},
}

// podValues stand in for the values the kubelet gives fieldRef variables
// in a pod of workload name: a StatefulSet's first pod's name.
func podValues(name string) map[string]string {
	return map[string]string{"status.podIP": "10.1.2.3", "metadata.name": name + "-0"}
}

// rendered is one overlay's objects, decoded.
type rendered struct {
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	services   []*corev1.Service
	pvcs       map[string]*corev1.PersistentVolumeClaim
	pdbs       []*policyv1.PodDisruptionBudget
	hpas       []*autoscalingv2.HorizontalPodAutoscaler
	workloads  []workload
}

// workload is a Deployment, StatefulSet or DaemonSet: its pod template.
type workload struct {
	kind, name string
	replicas   *int32
	pod        corev1.PodTemplateSpec
	claims     []string // volumeClaimTemplates' names
}

// decodeStrict decodes one object; a field the type lacks is an error.
func decodeStrict(y []byte, into any) error {
	return yaml.UnmarshalStrict(y, into)
}

// render builds overlay dir with kustomize and decodes every object.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	check.NoError(t, err, "kustomize build", dir)
	r := &rendered{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}, pvcs: map[string]*corev1.PersistentVolumeClaim{}}
	for _, res := range m.Resources() {
		y, err := res.AsYAML()
		check.NoError(t, err)
		gvk := res.GetApiVersion() + "/" + res.GetKind()
		var obj any
		switch gvk {
		case "v1/Namespace":
			obj = &corev1.Namespace{}
		case "v1/ConfigMap":
			cm := &corev1.ConfigMap{}
			obj, r.configMaps[res.GetName()] = cm, cm
		case "v1/Secret":
			s := &corev1.Secret{}
			obj, r.secrets[res.GetName()] = s, s
		case "v1/Service":
			s := &corev1.Service{}
			obj, r.services = s, append(r.services, s)
		case "v1/PersistentVolumeClaim":
			p := &corev1.PersistentVolumeClaim{}
			obj, r.pvcs[res.GetName()] = p, p
		case "apps/v1/Deployment":
			d := &appsv1.Deployment{}
			obj = d
			defer func() {
				r.workloads = append(r.workloads, workload{"Deployment", d.Name, d.Spec.Replicas, d.Spec.Template, nil})
			}()
		case "apps/v1/StatefulSet":
			s := &appsv1.StatefulSet{}
			obj = s
			defer func() {
				var claims []string
				for _, c := range s.Spec.VolumeClaimTemplates {
					claims = append(claims, c.Name)
				}
				r.workloads = append(r.workloads, workload{"StatefulSet", s.Name, s.Spec.Replicas, s.Spec.Template, claims})
			}()
		case "apps/v1/DaemonSet":
			d := &appsv1.DaemonSet{}
			obj = d
			defer func() { r.workloads = append(r.workloads, workload{"DaemonSet", d.Name, nil, d.Spec.Template, nil}) }()
		case "policy/v1/PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			obj, r.pdbs = p, append(r.pdbs, p)
		case "autoscaling/v2/HorizontalPodAutoscaler":
			h := &autoscalingv2.HorizontalPodAutoscaler{}
			obj, r.hpas = h, append(r.hpas, h)
		case "networking.k8s.io/v1/NetworkPolicy":
			obj = &networkingv1.NetworkPolicy{}
		default:
			t.Fatalf("%s: %s %s: a kind this test does not know; add it to the decoder", dir, gvk, res.GetName())
		}
		check.NoError(t, decodeStrict(y, obj), gvk, res.GetName())
		if ns := res.GetNamespace(); res.GetKind() != "Namespace" && ns != "kiln" {
			t.Errorf("%s %s is in namespace %q, want kiln", gvk, res.GetName(), ns)
		}
	}
	return r
}

// images are docker/Dockerfile's targets: their ENTRYPOINT, as exec-form
// JSON arrays, and the names docker/build.sh gives them.
type images struct {
	prefix      string              // docker/build.sh's default image prefix
	entrypoints map[string][]string // by target
}

func readImages(t *testing.T) images {
	t.Helper()
	df, err := os.ReadFile("../../docker/Dockerfile")
	check.NoError(t, err)
	im := images{entrypoints: map[string][]string{}}
	stage := ""
	for _, line := range strings.Split(string(df), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 4 && f[0] == "FROM" && strings.EqualFold(f[2], "AS"):
			stage = f[3]
		case len(f) > 1 && f[0] == "ENTRYPOINT":
			var argv []string
			check.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "ENTRYPOINT")), &argv), "Dockerfile stage", stage, "ENTRYPOINT")
			im.entrypoints[stage] = argv
		}
	}
	bs, err := os.ReadFile("../../docker/build.sh")
	check.NoError(t, err)
	m := regexp.MustCompile(`prefix="([^"]+)"`).FindSubmatch(bs)
	check.True(t, m != nil, "docker/build.sh names no default image prefix")
	im.prefix = string(m[1])
	return im
}

// target returns the Dockerfile target an image name is built from, or ""
// when it is not a kiln image.
func (im images) target(t *testing.T, image string) string {
	name := image
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	tgt, ok := strings.CutPrefix(name, im.prefix+"-")
	if !ok {
		return ""
	}
	if _, ok := im.entrypoints[tgt]; !ok {
		t.Errorf("image %s: docker/Dockerfile has no target %q with an ENTRYPOINT", image, tgt)
		return ""
	}
	return tgt
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand resolves $(VAR) in args as the kubelet does, from the
// container's environment; an unresolved reference is an error.
func (r *rendered) expand(t *testing.T, where string, w workload, c corev1.Container, args []string) []string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			v, ok := podValues(w.name)[e.ValueFrom.FieldRef.FieldPath]
			check.True(t, ok, where, "env", e.Name, "refers to field", e.ValueFrom.FieldRef.FieldPath)
			env[e.Name] = v
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, ok := r.configMaps[ref.Name]
			check.True(t, ok, where, "env", e.Name, "refers to ConfigMap", ref.Name, "which the overlay lacks")
			v, ok := cm.Data[ref.Key]
			check.True(t, ok, where, "env", e.Name, "refers to key", ref.Key, "which ConfigMap", ref.Name, "lacks")
			env[e.Name] = v
		case e.ValueFrom.SecretKeyRef != nil:
			r.checkSecretKey(t, where, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
			env[e.Name] = "secret"
		}
	}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			if !ok {
				t.Errorf("%s: argument %q refers to $(%s), which the container's environment lacks", where, a, name)
			}
			return v
		})
	}
	return out
}

// checkSecretKey checks that a Secret used is one the overlay makes or
// one the operator is told to make, with the key used.
func (r *rendered) checkSecretKey(t *testing.T, where, name, key string) {
	if s, ok := r.secrets[name]; ok {
		_, inData := s.Data[key]
		_, inString := s.StringData[key]
		check.True(t, key == "" || inData || inString, where, "uses key", key, "of Secret", name, "which lacks it")
		return
	}
	keys, ok := operatorSecrets[name]
	check.True(t, ok, where, "uses Secret", name, "which neither the overlay makes nor deploy/k8s/README.md asks for")
	check.True(t, key == "" || slices.Contains(keys, key), where, "uses key", key, "of Secret", name, "; the operator is told to make", keys)
}

var update = flag.Bool("update", false, "rewrite testdata/kiln-containers.json from the overlays")

// checkWorkloads checks every pod template and returns its kiln containers.
func (r *rendered) checkWorkloads(t *testing.T, overlay string, im images) []k8s.KilnContainer {
	var kiln []k8s.KilnContainer
	for _, w := range r.workloads {
		pod := w.pod.Spec
		vols := map[string]corev1.Volume{}
		for _, v := range pod.Volumes {
			vols[v.Name] = v
			where := w.kind + " " + w.name + " volume " + v.Name
			switch {
			case v.Secret != nil:
				r.checkSecretKey(t, where, v.Secret.SecretName, "")
				for _, it := range v.Secret.Items {
					r.checkSecretKey(t, where, v.Secret.SecretName, it.Key)
				}
			case v.ConfigMap != nil:
				_, ok := r.configMaps[v.ConfigMap.Name]
				check.True(t, ok, where, "refers to ConfigMap", v.ConfigMap.Name, "which the overlay lacks")
			case v.PersistentVolumeClaim != nil:
				_, ok := r.pvcs[v.PersistentVolumeClaim.ClaimName]
				check.True(t, ok, where, "refers to PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName, "which the overlay lacks")
			}
		}
		for _, c := range pod.Containers {
			where := w.kind + " " + w.name + " container " + c.Name
			var mounts []string
			for _, m := range c.VolumeMounts {
				_, ok := vols[m.Name]
				check.True(t, ok || slices.Contains(w.claims, m.Name), where, "mounts volume", m.Name, "which the pod lacks")
				mounts = append(mounts, m.MountPath)
			}
			for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
				if p != nil && p.HTTPGet != nil {
					check.True(t, declares(c, p.HTTPGet.Port), where, "probes port", p.HTTPGet.Port.String(), "which it does not declare")
				}
			}
			tgt := im.target(t, c.Image)
			if tgt == "" {
				continue
			}
			argv := c.Command
			if len(argv) == 0 {
				argv = im.entrypoints[tgt]
			}
			k := k8s.KilnContainer{
				Overlay: overlay, Where: where, Target: tgt, Mounts: mounts,
				Argv:     append(slices.Clone(argv), r.expand(t, where, w, c, c.Args)...),
				Liveness: httpProbe(c, c.LivenessProbe), Readiness: httpProbe(c, c.ReadinessProbe),
			}
			if w.replicas != nil {
				k.Replicas = *w.replicas
			}
			if g, ok := c.Resources.Limits["nvidia.com/gpu"]; ok {
				k.GPUs = g.Value()
			}
			kiln = append(kiln, k)
		}
	}
	return kiln
}

// httpProbe is p's HTTP GET, nil when p is none.
func httpProbe(c corev1.Container, p *corev1.Probe) *k8s.Probe {
	if p == nil || p.HTTPGet == nil {
		return nil
	}
	return &k8s.Probe{Path: p.HTTPGet.Path, Port: containerPort(c, p.HTTPGet.Port)}
}

// containerPort resolves a port (a number or a port's name).
func containerPort(c corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return -1
}

// declares reports whether c declares port p (a number or a name).
func declares(c corev1.Container, p intstr.IntOrString) bool {
	for _, cp := range c.Ports {
		if (p.Type == intstr.Int && int(cp.ContainerPort) == p.IntValue()) || (p.Type == intstr.String && cp.Name == p.StrVal) {
			return true
		}
	}
	return false
}

// checkRouting checks that Services, disruption budgets and autoscalers
// reach what they name, and returns the autoscalers' metrics.
func (r *rendered) checkRouting(t *testing.T) []string {
	matches := func(sel map[string]string) []workload {
		var out []workload
		for _, w := range r.workloads {
			ok := len(sel) > 0
			for k, v := range sel {
				ok = ok && w.pod.Labels[k] == v
			}
			if ok {
				out = append(out, w)
			}
		}
		return out
	}
	for _, s := range r.services {
		ws := matches(s.Spec.Selector)
		check.True(t, len(ws) > 0, "Service", s.Name, "selects no pods")
		for _, p := range s.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntValue() == 0 {
				target = intstr.FromInt32(p.Port) // the port itself
			}
			for _, w := range ws {
				found := false
				for _, c := range w.pod.Spec.Containers {
					found = found || declares(c, target)
				}
				check.True(t, found, "Service", s.Name, "port", p.Name, "targets a port", w.kind, w.name, "does not declare")
			}
		}
	}
	for _, p := range r.pdbs {
		check.True(t, p.Spec.Selector != nil && len(matches(p.Spec.Selector.MatchLabels)) > 0, "PodDisruptionBudget", p.Name, "selects no pods")
	}
	var metrics []string
	for _, h := range r.hpas {
		found := false
		for _, w := range r.workloads {
			found = found || (w.kind == h.Spec.ScaleTargetRef.Kind && w.name == h.Spec.ScaleTargetRef.Name)
		}
		check.True(t, found, "HorizontalPodAutoscaler", h.Name, "scales", h.Spec.ScaleTargetRef.Name, "which the overlay lacks")
		for _, m := range h.Spec.Metrics {
			check.True(t, m.External != nil, "HorizontalPodAutoscaler", h.Name, "scales on something other than the trackers' metrics")
			metrics = append(metrics, m.External.Metric.Name)
		}
	}
	return metrics
}

// TestOverlays renders every overlay under overlays/, checks it, and
// checks that testdata/kiln-containers.json (which cmdline/ checks against
// kiln's CLI and daemons) is what the overlays run.
func TestOverlays(t *testing.T) {
	im := readImages(t)
	dirs, err := filepath.Glob("overlays/*/kustomization.yaml")
	check.NoError(t, err)
	var names []string
	for _, d := range dirs {
		names = append(names, filepath.Base(filepath.Dir(d)))
	}
	for _, want := range []string{"etcd", "external-etcd", "embedded-etcd", "single"} {
		check.True(t, slices.Contains(names, want), "no overlay", want, "in", names)
	}
	var g k8s.Golden
	for _, name := range names {
		r := render(t, filepath.Join("overlays", name))
		kiln := r.checkWorkloads(t, name, im)
		// Every role is deployed: trackers, compiler nodes, one device
		// daemon per board kind, CUDA boards with a GPU each.
		byTarget := map[string]int{}
		for _, k := range kiln {
			byTarget[k.Target]++
			if k.Target == "device-cuda" {
				check.True(t, k.GPUs >= 1, name, k.Where, "requests no nvidia.com/gpu")
			}
		}
		for _, tgt := range []string{"tracker", "compiler", "device-cpu", "device-cuda"} {
			check.Equal(t, byTarget[tgt], 1, name, "containers of image", im.prefix+"-"+tgt)
		}
		// Several trackers (they share a store) keep two through a
		// voluntary disruption; one alone has no budget to keep.
		for _, k := range kiln {
			if k.Target != "tracker" {
				continue
			}
			check.True(t, k.Replicas == 1 || k.Replicas == 3, name, "kiln-tracker replicas", k.Replicas)
			budget := false
			for _, p := range r.pdbs {
				budget = budget || p.Name == "kiln-tracker"
			}
			check.Equal(t, budget, k.Replicas > 1, name, "a PodDisruptionBudget for", k.Replicas, "trackers")
		}
		for _, m := range r.checkRouting(t) {
			if !slices.Contains(g.ScaleMetrics, m) {
				g.ScaleMetrics = append(g.ScaleMetrics, m)
			}
		}
		g.Containers = append(g.Containers, kiln...)
	}
	got, err := json.MarshalIndent(g, "", "  ")
	check.NoError(t, err)
	got = append(got, '\n')
	golden := k8s.GoldenFile
	if *update {
		check.NoError(t, os.WriteFile(golden, got, 0o644))
	}
	want, err := os.ReadFile(golden)
	check.NoError(t, err)
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not what the overlays run; run go test ./deploy/k8s/ -update, then go test ./deploy/k8s/...\nrendered:\n%s", golden, got)
	}
}
