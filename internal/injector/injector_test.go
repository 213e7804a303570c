package injector_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/quarry-cc/quarry/internal/injector"
)

const coordAddr = "quarry-coordinator-mesh.quarry:2001"

func newInjector(t *testing.T, sgx string) *injector.Injector {
	t.Helper()
	in, err := injector.New(injector.Config{CoordinatorAddr: coordAddr, ClusterDomain: "cluster.local", SGXResource: sgx})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// review is what the API server sends for a pod being created.
func review(t *testing.T, raw []byte, op admissionv1.Operation, ns string) []byte {
	t.Helper()
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("4b1e1a4e-1c64-4d6c-9d43-0e7d3b0f2a11"),
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: ns,
			Operation: op,
			Object:    runtime.RawExtension{Raw: raw},
		},
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// post sends body to the webhook and decodes the AdmissionReview answer.
func post(t *testing.T, in *injector.Injector, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	srv := httptest.NewServer(in.Handler(nil))
	defer srv.Close()
	resp, err := http.Post(srv.URL+injector.PathMutate, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || out.Response == nil {
		t.Fatalf("answer %+v", out)
	}
	if out.Response.UID != "4b1e1a4e-1c64-4d6c-9d43-0e7d3b0f2a11" {
		t.Fatalf("response uid %q is not the request's", out.Response.UID)
	}
	return out.Response
}

// admit runs a pod through the webhook, applies the returned JSON patch
// with an independent JSON-patch implementation and returns the pod, its
// JSON, and the response.
func admit(t *testing.T, in *injector.Injector, raw []byte, ns string) (corev1.Pod, []byte) {
	t.Helper()
	resp := post(t, in, review(t, raw, admissionv1.Create, ns))
	if !resp.Allowed {
		t.Fatalf("refused: %v", resp.Result)
	}
	patched := raw
	if resp.Patch != nil {
		if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
			t.Fatalf("patch type %v", resp.PatchType)
		}
		p, err := jsonpatch.DecodePatch(resp.Patch)
		if err != nil {
			t.Fatalf("patch %s: %v", resp.Patch, err)
		}
		if patched, err = p.Apply(raw); err != nil {
			t.Fatalf("applying %s: %v", resp.Patch, err)
		}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(patched, &pod); err != nil {
		t.Fatal(err)
	}
	return pod, patched
}

// admitOnce admits a pod and checks that admitting the result again
// changes nothing (the API server may call a webhook again).
func admitOnce(t *testing.T, in *injector.Injector, p *corev1.Pod, ns string) corev1.Pod {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	pod, patched := admit(t, in, raw, ns)
	if again := post(t, in, review(t, patched, admissionv1.Create, ns)); !again.Allowed || again.Patch != nil {
		t.Fatalf("a second admission of the injected pod: allowed %v, patch %s", again.Allowed, again.Patch)
	}
	return pod
}

func env(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		if _, dup := m[e.Name]; dup {
			panic("duplicate env " + e.Name)
		}
		m[e.Name] = e.Value
	}
	return m
}

func marblePod(mtype string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "backend-", Labels: map[string]string{injector.LabelMarbleType: mtype, "app": "x"}},
		Spec:       corev1.PodSpec{Containers: containers},
	}
}

func limit(c corev1.Container, name string) string {
	q, ok := c.Resources.Limits[corev1.ResourceName(name)]
	if !ok {
		return ""
	}
	return q.String()
}

// checkUUID: the container's EDG_MARBLE_UUID_FILE is the pod's UID through
// the downward-API volume mounted at its directory.
func checkUUID(t *testing.T, pod corev1.Pod, c corev1.Container, dir string) {
	t.Helper()
	if got := env(c)[injector.EnvUUIDFile]; got != dir+"/uuid-file" {
		t.Fatalf("%s: %s = %q", c.Name, injector.EnvUUIDFile, got)
	}
	var vol string
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir {
			vol = m.Name
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == vol && v.DownwardAPI != nil && len(v.DownwardAPI.Items) == 1 &&
			v.DownwardAPI.Items[0].Path == "uuid-file" && v.DownwardAPI.Items[0].FieldRef.FieldPath == "metadata.uid" {
			return
		}
	}
	t.Fatalf("%s: no downward-API volume with metadata.uid mounted at %s (mounts %v, volumes %v)", c.Name, dir, c.VolumeMounts, pod.Spec.Volumes)
}

func TestInjectOneContainerIntel(t *testing.T) {
	in := newInjector(t, injector.IntelEPC)
	pod := admitOnce(t, in, marblePod("Backend", corev1.Container{Name: "app", Image: "app:1"}), "shop")
	c := pod.Spec.Containers[0]
	want := map[string]string{
		"EDG_MARBLE_COORDINATOR_ADDR": coordAddr,
		"EDG_MARBLE_TYPE":             "Backend",
		"EDG_MARBLE_DNS_NAMES":        "backend,backend.shop,backend.shop.svc.cluster.local",
		"EDG_MARBLE_UUID_FILE":        "/Backend-uid/uuid-file",
	}
	got := env(c)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	checkUUID(t, pod, c, "/Backend-uid")
	for name, v := range map[string]string{"sgx.intel.com/epc": "10Mi", "sgx.intel.com/enclave": "1", "sgx.intel.com/provision": "1"} {
		if limit(c, name) != v {
			t.Errorf("limit %s = %q, want %q", name, limit(c, name), v)
		}
	}
	if len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Key != "sgx.intel.com/epc" ||
		pod.Spec.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Spec.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("tolerations %v", pod.Spec.Tolerations)
	}
}

// Several containers, an init container, environment and resources of
// their own: the user's values win, everything else stays.
func TestInjectSeveralContainersKeepsTheirs(t *testing.T) {
	in := newInjector(t, injector.IntelEPC)
	p := marblePod("frontend",
		corev1.Container{Name: "web", Image: "web:1",
			Env: []corev1.EnvVar{{Name: "EDG_MARBLE_TYPE", Value: "custom"}, {Name: "LOG", Value: "debug"}},
			Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi"), "sgx.intel.com/enclave": resource.MustParse("2")},
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), "sgx.intel.com/epc": resource.MustParse("64Mi")},
			},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}},
		corev1.Container{Name: "worker", Image: "worker:1", Env: []corev1.EnvVar{{Name: "EDG_MARBLE_UUID_FILE", Value: "/data/uuid"}}},
	)
	p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}}
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "sgx", Effect: corev1.TaintEffectNoSchedule}}
	pod := admitOnce(t, in, p, "default")

	web, worker := pod.Spec.Containers[0], pod.Spec.Containers[1]
	if e := env(web); e["EDG_MARBLE_TYPE"] != "custom" || e["LOG"] != "debug" || e["EDG_MARBLE_COORDINATOR_ADDR"] != coordAddr {
		t.Errorf("web env %v", e)
	}
	if web.Env[0].Name != "EDG_MARBLE_TYPE" || web.Env[1].Name != "LOG" {
		t.Errorf("the container's own variables moved: %v", web.Env)
	}
	checkUUID(t, pod, web, "/frontend-uid")
	// The EPC request without a limit gets its own value as the limit;
	// the enclave limit set by the user stays; the rest is added.
	if limit(web, "sgx.intel.com/epc") != "64Mi" || limit(web, "sgx.intel.com/enclave") != "2" ||
		limit(web, "sgx.intel.com/provision") != "1" || limit(web, "memory") != "1Gi" {
		t.Errorf("web limits %v", web.Resources.Limits)
	}
	if q := web.Resources.Requests[corev1.ResourceCPU]; q.String() != "250m" {
		t.Errorf("web requests %v", web.Resources.Requests)
	}
	if len(web.VolumeMounts) != 2 || web.VolumeMounts[0].Name != "data" {
		t.Errorf("web mounts %v", web.VolumeMounts)
	}
	// worker sets its own UUID file: no mount for it.
	if e := env(worker); e["EDG_MARBLE_UUID_FILE"] != "/data/uuid" || e["EDG_MARBLE_TYPE"] != "frontend" {
		t.Errorf("worker env %v", e)
	}
	if len(worker.VolumeMounts) != 0 {
		t.Errorf("worker mounts %v", worker.VolumeMounts)
	}
	if limit(worker, "sgx.intel.com/epc") != "10Mi" {
		t.Errorf("worker limits %v", worker.Resources.Limits)
	}
	// Init containers are not Marbles.
	if ic := pod.Spec.InitContainers[0]; len(ic.Env) != 1 || len(ic.Resources.Limits) != 0 || len(ic.VolumeMounts) != 0 {
		t.Errorf("init container changed: %+v", ic)
	}
	if len(pod.Spec.Volumes) != 2 || len(pod.Spec.Tolerations) != 2 || pod.Spec.Tolerations[0].Key != "dedicated" {
		t.Errorf("volumes %v, tolerations %v", pod.Spec.Volumes, pod.Spec.Tolerations)
	}
}

// marblerun/marblecontainer: only the named container; Azure's plugin;
// marblerun/resource-injection=disabled.
func TestInjectMarbleContainerAzureAndDisabled(t *testing.T) {
	in := newInjector(t, injector.AzureEPC)
	p := marblePod("db", corev1.Container{Name: "proxy", Image: "envoy"}, corev1.Container{Name: "db", Image: "db"})
	p.Labels[injector.LabelMarbleContainer] = "db"
	pod := admitOnce(t, in, p, "data")
	proxy, db := pod.Spec.Containers[0], pod.Spec.Containers[1]
	if len(proxy.Env) != 0 || len(proxy.Resources.Limits) != 0 || len(proxy.VolumeMounts) != 0 {
		t.Errorf("the sidecar was injected: %+v", proxy)
	}
	if env(db)["EDG_MARBLE_DNS_NAMES"] != "db,db.data,db.data.svc.cluster.local" {
		t.Errorf("db env %v", db.Env)
	}
	if limit(db, injector.AzureEPC) != "10" || len(db.Resources.Limits) != 1 {
		t.Errorf("db limits %v", db.Resources.Limits)
	}
	if len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Key != injector.AzureEPC {
		t.Errorf("tolerations %v", pod.Spec.Tolerations)
	}

	p = marblePod("db", corev1.Container{Name: "db", Image: "db"})
	p.Labels[injector.LabelResourceInjection] = "disabled"
	pod = admitOnce(t, in, p, "data")
	if c := pod.Spec.Containers[0]; len(c.Resources.Limits) != 0 || len(pod.Spec.Tolerations) != 0 || env(c)["EDG_MARBLE_TYPE"] != "db" {
		t.Errorf("resource-injection=disabled: limits %v, tolerations %v, env %v", c.Resources.Limits, pod.Spec.Tolerations, c.Env)
	}
}

// Fields this build's types do not know survive: the patch only adds.
func TestInjectKeepsUnknownFields(t *testing.T) {
	in := newInjector(t, injector.IntelEPC)
	raw := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"m","labels":{"marblerun/marbletype":"m"}},
		"spec":{"futurePodField":{"a":1},"containers":[{"name":"c","image":"i","futureContainerField":true,
		"resources":{"limits":{"cpu":"1000m"},"futureResourceField":"x"}}]}}`)
	_, patched := admit(t, in, raw, "ns")
	var doc map[string]any
	json.Unmarshal(patched, &doc)
	spec := doc["spec"].(map[string]any)
	c := spec["containers"].([]any)[0].(map[string]any)
	res := c["resources"].(map[string]any)
	if spec["futurePodField"] == nil || c["futureContainerField"] != true || res["futureResourceField"] != "x" ||
		res["limits"].(map[string]any)["cpu"] != "1000m" || res["limits"].(map[string]any)["sgx.intel.com/epc"] != "10Mi" {
		t.Fatalf("patched pod %s", patched)
	}
}

// The namespace of the request names the pod's DNS names; a pod with no
// namespace at all is in "default".
func TestInjectNamespace(t *testing.T) {
	in := newInjector(t, injector.IntelEPC)
	p := marblePod("a", corev1.Container{Name: "c"})
	p.Namespace = "fromobject"
	raw, _ := json.Marshal(p)
	for ns, want := range map[string]string{"req": "a,a.req,a.req.svc.cluster.local", "": "a,a.fromobject,a.fromobject.svc.cluster.local"} {
		pod, _ := admit(t, in, raw, ns)
		if got := env(pod.Spec.Containers[0])["EDG_MARBLE_DNS_NAMES"]; got != want {
			t.Errorf("namespace %q: %s", ns, got)
		}
	}
}

func TestRefusals(t *testing.T) {
	in := newInjector(t, injector.IntelEPC)
	named := marblePod("a", corev1.Container{Name: "c"})
	named.Labels[injector.LabelMarbleContainer] = "missing"
	collide := marblePod("a", corev1.Container{Name: "c"})
	collide.Spec.Volumes = []corev1.Volume{{Name: injector.UUIDVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	nolabel := marblePod("a", corev1.Container{Name: "c"})
	delete(nolabel.Labels, injector.LabelMarbleType)
	for name, c := range map[string]struct {
		pod  any
		want string
	}{
		"no label":          {nolabel, "no marblerun/marbletype label"},
		"empty label":       {marblePod("", corev1.Container{Name: "c"}), "no marblerun/marbletype label"},
		"bad label":         {marblePod("../etc", corev1.Container{Name: "c"}), "not a valid label value"},
		"missing container": {named, `names container "missing", which the pod does not have (its containers: c)`},
		"volume collision":  {collide, `volume named "marble-uuid" that is not the injector's`},
		"no containers":     {marblePod("a"), "no containers"},
		"not a pod":         {map[string]any{"metadata": map[string]any{"labels": map[string]any{"marblerun/marbletype": "a"}}, "spec": "x"}, "not a valid Pod"},
	} {
		t.Run(name, func(t *testing.T) {
			raw, _ := json.Marshal(c.pod)
			resp := post(t, in, review(t, raw, admissionv1.Create, "ns"))
			if resp.Allowed || resp.Patch != nil || resp.Result == nil || resp.Result.Code != 400 || !strings.Contains(resp.Result.Message, c.want) {
				t.Fatalf("allowed %v, patch %s, result %+v; want a refusal saying %q", resp.Allowed, resp.Patch, resp.Result, c.want)
			}
		})
	}
}

// Operations other than CREATE, and objects other than pods, pass
// unchanged.
func TestPassesOtherRequests(t *testing.T) {
	in := newInjector(t, injector.IntelEPC)
	raw, _ := json.Marshal(marblePod("a", corev1.Container{Name: "c"}))
	if resp := post(t, in, review(t, raw, admissionv1.Update, "ns")); !resp.Allowed || resp.Patch != nil {
		t.Errorf("UPDATE: allowed %v, patch %s", resp.Allowed, resp.Patch)
	}
	body := review(t, raw, admissionv1.Create, "ns")
	var r admissionv1.AdmissionReview
	json.Unmarshal(body, &r)
	r.Request.Kind = metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	body, _ = json.Marshal(r)
	if resp := post(t, in, body); !resp.Allowed || resp.Patch != nil {
		t.Errorf("a Deployment: allowed %v, patch %s", resp.Allowed, resp.Patch)
	}
}

// Requests that are not AdmissionReviews get HTTP errors.
func TestBadRequests(t *testing.T) {
	in := newInjector(t, injector.IntelEPC)
	srv := httptest.NewServer(in.Handler(nil))
	defer srv.Close()
	raw, _ := json.Marshal(marblePod("a", corev1.Container{Name: "c"}))
	good := review(t, raw, admissionv1.Create, "ns")
	v1beta1 := bytes.Replace(good, []byte(`admission.k8s.io/v1"`), []byte(`admission.k8s.io/v1beta1"`), 1)
	noUID := bytes.Replace(good, []byte(`"uid":"4b1e1a4e-1c64-4d6c-9d43-0e7d3b0f2a11"`), []byte(`"uid":""`), 1)
	for name, c := range map[string]struct {
		method, ctype string
		body          []byte
		status        int
	}{
		"GET":          {"GET", "application/json", nil, 405},
		"content type": {"POST", "text/plain", good, 415},
		"not JSON":     {"POST", "application/json", []byte("{"), 400},
		"v1beta1":      {"POST", "application/json", v1beta1, 400},
		"no uid":       {"POST", "application/json", noUID, 400},
		"no request":   {"POST", "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), 400},
		"too large":    {"POST", "application/json", bytes.Repeat([]byte(" "), injector.MaxBody+1), 413},
		"good":         {"POST", "application/json; charset=utf-8", good, 200},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+injector.PathMutate, bytes.NewReader(c.body))
		req.Header.Set("Content-Type", c.ctype)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d", name, resp.StatusCode, c.status)
		}
	}
	resp, err := http.Get(srv.URL + injector.PathHealthz)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, c := range []injector.Config{
		{CoordinatorAddr: "quarry-mesh", ClusterDomain: "cluster.local", SGXResource: injector.IntelEPC},
		{CoordinatorAddr: "quarry-mesh:0", ClusterDomain: "cluster.local", SGXResource: injector.IntelEPC},
		{CoordinatorAddr: "quarry-mesh:2001", ClusterDomain: "Cluster Local", SGXResource: injector.IntelEPC},
		{CoordinatorAddr: "quarry-mesh:2001", ClusterDomain: "cluster.local", SGXResource: "epc"},
	} {
		if _, err := injector.New(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
