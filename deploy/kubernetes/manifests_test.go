// Package kubernetes holds sluice's Kubernetes manifests (a kustomize base
// under sluice/, an example Redis under redis/) and the test that decodes
// every one of them strictly into the Kubernetes API types, so that a
// misspelt field fails CI rather than being dropped by the API server.
package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// newObject returns an empty object of the Go type for apiVersion and kind,
// or nil for a kind the manifests are not expected to hold.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}
	case "v1 Service":
		return &corev1.Service{}
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "v1 Secret":
		return &corev1.Secret{}
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		return &kusttypes.Kustomization{}
	}
	return nil
}

// decodeStrict decodes every YAML document of data into its API type,
// refusing unknown and duplicate fields and field names in another case
// (encoding/json alone would take "targetport" for targetPort).
func decodeStrict(name string, data []byte) ([]any, error) {
	var objs []any
	r := utilyaml.NewYAMLReader(bufioReader(data))
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		obj := newObject(tm.APIVersion, tm.Kind)
		if obj == nil {
			return nil, fmt.Errorf("%s: document %d: unexpected %s %s", name, i, tm.APIVersion, tm.Kind)
		}
		// As the API server decodes: field names match case-sensitively,
		// and an unknown or repeated field is an error.
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d (%s): %w", name, i, tm.Kind, err)
		}
		strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err = errors.Join(append(strict, err)...); err != nil {
			return nil, fmt.Errorf("%s: document %d (%s): %w", name, i, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
}

func bufioReader(data []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(data)) }

// stripComments returns doc without its comment lines.
func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.SplitAfter(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}
	return out
}

// TestManifestsDecodeStrictly decodes every YAML file under this directory.
func TestManifestsDecodeStrictly(t *testing.T) {
	t.Parallel()
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		objs, err := decodeStrict(path, data)
		if err != nil {
			t.Error(err)
		}
		n += len(objs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("decoded %d objects, want the whole set (at least 10)", n)
	}
}

// TestDecodeStrictRefusesTypos checks that the decoding the manifests
// pass would catch a misspelt field and a field given twice.
func TestDecodeStrictRefusesTypos(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"misspelt field": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n",
		"nested typo":    "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 80, targetport: 8080}]\n",
		"duplicate":      "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nmetadata: {name: y}\n",
		"unknown kind":   "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
		"kustomization":  "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresource: [a.yaml]\n",
	} {
		if _, err := decodeStrict(name, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// build runs kustomize on dir and decodes its output strictly.
func build(t *testing.T, dir string) []any {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict("kustomize build "+dir, out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestKustomizeBuild builds each kustomization and checks that the
// objects refer to each other correctly: selectors select the pods,
// probes and Services name ports the container has, the Secret and
// ConfigMap the pod reads exist with the keys it reads, and the
// autoscaler and the disruption budget govern the Deployment.
func TestKustomizeBuild(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{"sluice", "redis"} {
		build(t, dir)
	}
	objs := build(t, ".")

	deployments := map[string]*appsv1.Deployment{}
	configMaps := map[string]*corev1.ConfigMap{}
	secrets := map[string]*corev1.Secret{}
	var services []*corev1.Service
	var pdbs []*policyv1.PodDisruptionBudget
	var hpas []*autoscalingv2.HorizontalPodAutoscaler
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			deployments[o.Name] = o
		case *corev1.ConfigMap:
			configMaps[o.Name] = o
		case *corev1.Secret:
			secrets[o.Name] = o
		case *corev1.Service:
			services = append(services, o)
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, o)
		case *autoscalingv2.HorizontalPodAutoscaler:
			hpas = append(hpas, o)
		}
	}
	sluice := deployments["sluice"]
	if sluice == nil || deployments["redis"] == nil || len(pdbs) != 1 || len(hpas) != 1 {
		t.Fatalf("want Deployments sluice and redis, a PodDisruptionBudget and a HorizontalPodAutoscaler; got %d deployments, %d PDBs, %d HPAs", len(deployments), len(pdbs), len(hpas))
	}

	for name, d := range deployments {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			t.Fatalf("deployment %s: %v", name, err)
		}
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("deployment %s: selector %v does not select its pods %v", name, sel, d.Spec.Template.Labels)
		}
		checkPod(t, name, &d.Spec.Template.Spec, configMaps, secrets)
	}

	for _, s := range services {
		var target *appsv1.Deployment
		for _, d := range deployments {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				if target != nil {
					t.Errorf("service %s selects the pods of %s and %s", s.Name, target.Name, d.Name)
				}
				target = d
			}
		}
		if target == nil {
			t.Errorf("service %s selects no pods", s.Name)
			continue
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.StrVal != "" && !hasPort(&target.Spec.Template.Spec, p.TargetPort.StrVal) {
				t.Errorf("service %s: targetPort %s is not a port of %s", s.Name, p.TargetPort.StrVal, target.Name)
			}
		}
	}
	for _, p := range pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(sluice.Spec.Template.Labels)) {
			t.Errorf("PodDisruptionBudget %s does not select sluice's pods (%v)", p.Name, err)
		}
	}
	for _, h := range hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || deployments[ref.Name] != sluice {
			t.Errorf("HorizontalPodAutoscaler %s scales %s %s, want the sluice Deployment", h.Name, ref.Kind, ref.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 {
			t.Errorf("HorizontalPodAutoscaler %s may scale below 2 replicas: the PodDisruptionBudget would block every drain", h.Name)
		}
	}

	// sluice reads its rules where the ConfigMap is mounted.
	c := sluice.Spec.Template.Spec.Containers[0]
	rulesPath := ""
	for _, e := range c.Env {
		if e.Name == "SLUICE_RULES" {
			rulesPath = e.Value
		}
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range sluice.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == "sluice-rules" && m.MountPath == rulesPath {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("SLUICE_RULES is %q, which is not where ConfigMap sluice-rules is mounted", rulesPath)
	}

	checkMemory(t, &c)
	checkNetworkPolicy(t, sluice)

	// The rules in the ConfigMap are checked by sluice's own tests
	// (cmd/sluice TestDeployRules): this module does not depend on sluice's,
	// so that its go.mod need not follow sluice's dependencies.
	if len(configMaps["sluice-rules"].Data) == 0 {
		t.Error("ConfigMap sluice-rules holds no rules")
	}
}

// checkPod checks a pod template: probes on named ports of the container,
// Secrets and ConfigMaps that exist, and an unprivileged container.
func checkPod(t *testing.T, name string, spec *corev1.PodSpec, configMaps map[string]*corev1.ConfigMap, secrets map[string]*corev1.Secret) {
	t.Helper()
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("deployment %s: pods may run as root", name)
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && configMaps[v.ConfigMap.Name] == nil {
			t.Errorf("deployment %s: volume %s: no ConfigMap %s", name, v.Name, v.ConfigMap.Name)
		}
	}
	for _, c := range spec.Containers {
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("deployment %s, container %s: want a CPU request and a memory limit", name, c.Name)
		}
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("deployment %s, container %s: want readiness and liveness probes", name, c.Name)
		}
		for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
			if p == nil {
				continue
			}
			port := ""
			switch {
			case p.HTTPGet != nil:
				port = p.HTTPGet.Port.StrVal
			case p.TCPSocket != nil:
				port = p.TCPSocket.Port.StrVal
			}
			if port != "" && !hasPort(spec, port) {
				t.Errorf("deployment %s: a probe names port %s, which the container lacks", name, port)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			s := secrets[ref.Name]
			if s == nil {
				t.Errorf("deployment %s: $%s reads Secret %s, which does not exist", name, e.Name, ref.Name)
				continue
			}
			if _, ok := s.StringData[ref.Key]; !ok {
				if _, ok := s.Data[ref.Key]; !ok {
					t.Errorf("deployment %s: $%s reads key %s, which Secret %s lacks", name, e.Name, ref.Key, ref.Name)
				}
			}
		}
		for _, m := range c.VolumeMounts {
			found := false
			for _, v := range spec.Volumes {
				found = found || v.Name == m.Name
			}
			if !found {
				t.Errorf("deployment %s: mount %s names no volume", name, m.Name)
			}
		}
	}
}

// hasPort reports whether a container of spec has a port called name.
func hasPort(spec *corev1.PodSpec, name string) bool {
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// checkMemory checks that what sluice may hold in process (SLUICE_MAX_MEMORY,
// whose default 256MiB would be the whole of a 256Mi limit) leaves at least
// half of the container's memory limit to the Go runtime and connections.
func checkMemory(t *testing.T, c *corev1.Container) {
	t.Helper()
	budget := int64(-1)
	for _, e := range c.Env {
		if e.Name != "SLUICE_MAX_MEMORY" {
			continue
		}
		units := map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
		for suffix, unit := range units {
			if n, ok := strings.CutSuffix(e.Value, suffix); ok {
				var v int64
				if _, err := fmt.Sscan(n, &v); err == nil {
					budget = v * unit
				}
			}
		}
		if budget < 0 {
			t.Fatalf("SLUICE_MAX_MEMORY %q: want a number of KiB, MiB or GiB", e.Value)
		}
	}
	if budget < 0 {
		t.Fatal("sluice's container sets no SLUICE_MAX_MEMORY: the default (256MiB) is not sized to its memory limit")
	}
	if limit := c.Resources.Limits.Memory().Value(); 2*budget > limit {
		t.Errorf("SLUICE_MAX_MEMORY is %d bytes, more than half the container's memory limit (%d bytes)", budget, limit)
	}
}

// checkNetworkPolicy checks the example NetworkPolicy (kept out of the
// kustomization: who may call sluice depends on the cluster) against the
// built Deployment: it selects sluice's pods and admits named ports the
// container has.
func checkNetworkPolicy(t *testing.T, sluice *appsv1.Deployment) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("sluice", "networkpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict("sluice/networkpolicy.yaml", data)
	if err != nil || len(objs) != 1 {
		t.Fatalf("networkpolicy.yaml: want one NetworkPolicy, got %d objects (%v)", len(objs), err)
	}
	np, ok := objs[0].(*networkingv1.NetworkPolicy)
	if !ok {
		t.Fatalf("networkpolicy.yaml holds a %T", objs[0])
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || !sel.Matches(labels.Set(sluice.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy %s does not select sluice's pods %v (%v)", np.Name, sluice.Spec.Template.Labels, err)
	}
	if len(np.Spec.Ingress) == 0 {
		t.Errorf("NetworkPolicy %s admits nothing", np.Name)
	}
	for _, in := range np.Spec.Ingress {
		if len(in.From) == 0 {
			t.Errorf("NetworkPolicy %s: an ingress rule admits every peer", np.Name)
		}
		for _, p := range in.Ports {
			if p.Port == nil || p.Port.StrVal == "" || !hasPort(&sluice.Spec.Template.Spec, p.Port.StrVal) {
				t.Errorf("NetworkPolicy %s: port %v is not a named port of sluice's container", np.Name, p.Port)
			}
		}
	}
}
