package kubernetes

import (
	"github.com/sluicehq/sluice/deploy/internal/redisconf"
	"os"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// deployments builds the whole kustomization (sluice and the example
// Redis) and returns its Deployments and Services by name.
func deployments(t *testing.T) (map[string]*appsv1.Deployment, []*corev1.Service) {
	t.Helper()
	ds := map[string]*appsv1.Deployment{}
	var svcs []*corev1.Service
	for _, o := range build(t, ".") {
		switch o := o.(type) {
		case *appsv1.Deployment:
			ds[o.Name] = o
		case *corev1.Service:
			svcs = append(svcs, o)
		}
	}
	if ds["sluice"] == nil || ds["redis"] == nil {
		t.Fatalf("want Deployments sluice and redis, got %d", len(ds))
	}
	return ds, svcs
}

// TestRedisNoEviction checks the example Redis: under noeviction it
// refuses writes at its maxmemory (sluice decides by its fail mode and
// counts sluice_store_errors_total{reason="oom"}) instead of evicting a
// client's count, which would let the client start over; its maxmemory
// leaves a quarter of the container's memory limit to Redis's own
// overhead, so that the kernel's OOM killer does not come first; and the
// pod requests all of its limit, so that the node keeps it.
func TestRedisNoEviction(t *testing.T) {
	t.Parallel()
	ds, _ := deployments(t)
	c := ds["redis"].Spec.Template.Spec.Containers[0]
	args := map[string]string{}
	for i := 0; i+1 < len(c.Args); i++ {
		if strings.HasPrefix(c.Args[i], "--") {
			args[c.Args[i]] = c.Args[i+1]
		}
	}
	if p := args["--maxmemory-policy"]; p != "noeviction" {
		t.Errorf("redis --maxmemory-policy %q, want noeviction: Redis would evict counts under memory pressure", p)
	}
	maxmem, err := redisconf.Bytes(args["--maxmemory"])
	if err != nil || maxmem <= 0 {
		t.Fatalf("redis --maxmemory %q: want a size (%v)", args["--maxmemory"], err)
	}
	limit := c.Resources.Limits.Memory().Value()
	if 4*maxmem > 3*limit {
		t.Errorf("redis --maxmemory is %d bytes, more than three quarters of its memory limit (%d bytes)", maxmem, limit)
	}
	if req := c.Resources.Requests.Memory().Value(); req != limit {
		t.Errorf("redis requests %d bytes of memory and is limited to %d: want the request at the limit", req, limit)
	}
}

// TestImagesVersionTagged checks that every container names its image
// with a version tag, never latest or none (which a cluster resolves to
// :latest from a public registry), and that sluice's is the version of
// CHANGELOG.md's newest entry, which scripts/release.sh builds.
func TestImagesVersionTagged(t *testing.T) {
	t.Parallel()
	ds, _ := deployments(t)
	tag := regexp.MustCompile(`^[a-z0-9./_-]+:v?[0-9]+\.[0-9]+([.-][0-9A-Za-z.-]+)?$`)
	for name, d := range ds {
		for _, c := range d.Spec.Template.Spec.Containers {
			if !tag.MatchString(c.Image) {
				t.Errorf("deployment %s, container %s: image %q, want a version tag", name, c.Name, c.Image)
			}
		}
	}
	if got, want := ds["sluice"].Spec.Template.Spec.Containers[0].Image, "sluice:"+changelogVersion(t); got != want {
		t.Errorf("sluice's image is %s, want %s (CHANGELOG.md's newest version)", got, want)
	}
}

// TestImagePullPolicy checks that every container's image is pulled only
// when the node lacks it: an image built here and loaded into the
// cluster (kind load, k3s ctr import, minikube image load) is the one
// that runs.
func TestImagePullPolicy(t *testing.T) {
	t.Parallel()
	ds, _ := deployments(t)
	for name, d := range ds {
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("deployment %s, container %s: imagePullPolicy %q, want IfNotPresent", name, c.Name, c.ImagePullPolicy)
			}
		}
	}
}

// TestServicesNoAdminPort checks that the Services expose sluice's
// decision and metrics ports only: the dashboard and admin API (8083)
// stay on the pod's loopback, reached with kubectl port-forward.
func TestServicesNoAdminPort(t *testing.T) {
	t.Parallel()
	_, svcs := deployments(t)
	for _, s := range svcs {
		for _, p := range s.Spec.Ports {
			if p.Port == 8083 || p.TargetPort.IntValue() == 8083 || p.Name == "ui" || p.Name == "admin" {
				t.Errorf("service %s exposes %s (%d)", s.Name, p.Name, p.Port)
			}
		}
	}
}

// changelogVersion returns the version of CHANGELOG.md's first "## vX.Y.Z"
// heading.
func changelogVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## \[?(v[0-9]+\.[0-9]+\.[0-9]+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("CHANGELOG.md has no version heading (## vX.Y.Z)")
	}
	return string(m[1])
}
