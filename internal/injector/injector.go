// Package injector is the Marble injector: a Kubernetes mutating admission
// webhook that adds to every Marble pod what a Marble needs to find and
// activate at the Coordinator — the EDG_MARBLE_* environment, a file with
// the pod's UID as the Marble's UUID, and the SGX device plugin's
// resources and toleration — under MarbleRun's labels and names, so that
// Marble pod specs written for MarbleRun's injector work unchanged
// (docs/deployment.md, "Marble injector").
//
// The package is a leaf: it decodes an AdmissionReview, computes a JSON
// patch (RFC 6902) and encodes the answer; cmd/marble-injector serves it
// over TLS and logs.
package injector

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MarbleRun's pod labels (docs/deployment.md, "Marble injector").
const (
	// LabelMarbleType names the Marble type of the manifest; pods without
	// it are not Marbles.
	LabelMarbleType = "marblerun/marbletype"
	// LabelMarbleContainer limits the injection to the named container.
	LabelMarbleContainer = "marblerun/marblecontainer"
	// LabelResourceInjection "disabled" leaves the SGX resources and
	// toleration out.
	LabelResourceInjection = "marblerun/resource-injection"
)

// The environment the Marble runtime reads (MarbleRun's names).
const (
	EnvCoordinatorAddr = "EDG_MARBLE_COORDINATOR_ADDR"
	EnvMarbleType      = "EDG_MARBLE_TYPE"
	EnvDNSNames        = "EDG_MARBLE_DNS_NAMES"
	EnvUUIDFile        = "EDG_MARBLE_UUID_FILE"
)

// UUIDVolume is the downward-API volume holding the pod's UID in file
// UUIDFileName, mounted at /<marble type>-uid.
const (
	UUIDVolume   = "marble-uuid"
	UUIDFileName = "uuid-file"
)

// SGX device plugins' resource names.
const (
	IntelEPC       = "sgx.intel.com/epc"
	IntelEnclave   = "sgx.intel.com/enclave"
	IntelProvision = "sgx.intel.com/provision"
	AzureEPC       = "kubernetes.azure.com/sgx_epc_mem_in_MiB"
	AlibabaEPC     = "alibabacloud.com/sgx_epc_MiB"
)

// Errors.
var (
	// ErrConfig: an Injector setting is not usable.
	ErrConfig = errors.New("injector: invalid configuration")
	// ErrBadReview: the body is not an admission.k8s.io/v1 AdmissionReview
	// request; answered with HTTP 400, not with a review.
	ErrBadReview = errors.New("not an admission.k8s.io/v1 AdmissionReview request")
)

// RefusalError is a pod the injector refuses to admit; the API server shows
// Reason to whoever created the pod.
type RefusalError struct {
	Reason string
}

func (e *RefusalError) Error() string { return "marble injector: " + e.Reason }

func refuse(format string, args ...any) error {
	return &RefusalError{Reason: fmt.Sprintf(format, args...)}
}

// Config is the injector's settings (cmd/marble-injector's flags).
type Config struct {
	// CoordinatorAddr is the Coordinator's Marble API, host:port
	// (EDG_MARBLE_COORDINATOR_ADDR).
	CoordinatorAddr string
	// ClusterDomain ends the pods' fully qualified DNS names.
	ClusterDomain string
	// SGXResource is the device plugin's EPC resource (IntelEPC, AzureEPC,
	// AlibabaEPC or another plugin's name).
	SGXResource string
}

// Injector computes the patches.
type Injector struct {
	cfg Config
}

var (
	resourceName = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsDomain    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// A Kubernetes label value that is not empty.
	labelValue = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
)

// New checks cfg.
func New(cfg Config) (*Injector, error) {
	host, port, err := net.SplitHostPort(cfg.CoordinatorAddr)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("%w: coordinator address %q: want host:port of the Coordinator's Marble API, e.g. quarry-coordinator-mesh.quarry:2001", ErrConfig, cfg.CoordinatorAddr)
	}
	if !dnsDomain.MatchString(cfg.ClusterDomain) {
		return nil, fmt.Errorf("%w: cluster domain %q: want a DNS domain such as cluster.local", ErrConfig, cfg.ClusterDomain)
	}
	if !resourceName.MatchString(cfg.SGXResource) || !strings.Contains(cfg.SGXResource, "/") {
		return nil, fmt.Errorf("%w: SGX resource %q: want the device plugin's extended resource name, e.g. %s or %s", ErrConfig, cfg.SGXResource, IntelEPC, AzureEPC)
	}
	return &Injector{cfg: cfg}, nil
}

// sgxLimits are the resources a Marble container gets from the configured
// device plugin. Intel's plugin counts EPC as a quantity of memory and
// hands out the enclave and provisioning devices as resources of their own;
// Azure's and Alibaba's count EPC in MiB.
func (in *Injector) sgxLimits() [][2]string {
	switch in.cfg.SGXResource {
	case IntelEPC:
		return [][2]string{{IntelEPC, "10Mi"}, {IntelEnclave, "1"}, {IntelProvision, "1"}}
	default:
		return [][2]string{{in.cfg.SGXResource, "10"}}
	}
}

// Op is one JSON patch operation (RFC 6902); the injector only adds.
type Op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// pointer escapes a JSON pointer token (RFC 6901).
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

// Patch returns the operations that make raw, a Pod in namespace, a
// Marble pod; none when it is one already. A pod that cannot be made one
// gets a *RefusalError.
func (in *Injector) Patch(raw []byte, namespace string) ([]Op, error) {
	var pod corev1.Pod
	if err := json.Unmarshal(raw, &pod); err != nil {
		return nil, refuse("the object is not a valid Pod: %v", err)
	}
	// The same object untyped: which fields are present decides between
	// adding a list or appending to it, and the patch never rewrites
	// fields it does not add (a typed round trip would drop fields this
	// build does not know).
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, refuse("the object is not a valid Pod: %v", err)
	}
	mtype, ok := pod.Labels[LabelMarbleType]
	if !ok || mtype == "" {
		return nil, refuse("pod has no %s label: only Marble pods can be injected; label the pod with its Marble type from the manifest, or keep it out of the webhook's objectSelector", LabelMarbleType)
	}
	if !labelValue.MatchString(mtype) {
		return nil, refuse("label %s=%q is not a valid label value (letters, digits, '-', '_', '.', at most 63)", LabelMarbleType, mtype)
	}
	if namespace == "" {
		namespace = pod.Namespace
	}
	if namespace == "" {
		namespace = "default"
	}
	targets := make([]int, 0, len(pod.Spec.Containers))
	if name := pod.Labels[LabelMarbleContainer]; name != "" {
		i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
		if i < 0 {
			var names []string
			for _, c := range pod.Spec.Containers {
				names = append(names, c.Name)
			}
			return nil, refuse("label %s names container %q, which the pod does not have (its containers: %s)", LabelMarbleContainer, name, strings.Join(names, ", "))
		}
		targets = append(targets, i)
	} else {
		for i := range pod.Spec.Containers {
			targets = append(targets, i)
		}
	}
	if len(targets) == 0 {
		return nil, refuse("the pod has no containers")
	}

	uuidDir := "/" + mtype + "-uid"
	env := []corev1.EnvVar{
		{Name: EnvCoordinatorAddr, Value: in.cfg.CoordinatorAddr},
		{Name: EnvMarbleType, Value: mtype},
		{Name: EnvDNSNames, Value: strings.ToLower(fmt.Sprintf("%s,%s.%s,%s.%s.svc.%s", mtype, mtype, namespace, mtype, namespace, in.cfg.ClusterDomain))},
		{Name: EnvUUIDFile, Value: uuidDir + "/" + UUIDFileName},
	}
	sgx := pod.Labels[LabelResourceInjection] != "disabled"

	var ops []Op
	needVolume := false
	for _, i := range targets {
		c := pod.Spec.Containers[i]
		base := []string{"spec", "containers", strconv.Itoa(i)}
		cdoc := get(doc, base...)
		// Environment: variables already set keep their value.
		ownUUID := false
		var add []corev1.EnvVar
		for _, e := range env {
			if slices.ContainsFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name }) {
				continue
			}
			add = append(add, e)
			ownUUID = ownUUID || e.Name == EnvUUIDFile
		}
		ops = appendList(ops, cdoc, base, "env", add)
		// The UUID file, when this container's EDG_MARBLE_UUID_FILE is ours
		// and nothing is mounted at its directory yet.
		if ownUUID && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.TrimSuffix(m.MountPath, "/") == uuidDir }) {
			ops = appendList(ops, cdoc, base, "volumeMounts", []corev1.VolumeMount{{Name: UUIDVolume, MountPath: uuidDir, ReadOnly: true}})
			needVolume = true
		}
		if sgx {
			ops = append(ops, in.resourceOps(c, cdoc, base)...)
		}
	}
	if needVolume {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == UUIDVolume })
		switch {
		case i < 0:
			vol := corev1.Volume{Name: UUIDVolume, VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
				Items: []corev1.DownwardAPIVolumeFile{{Path: UUIDFileName, FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
			}}}
			ops = appendList(ops, get(doc, "spec"), []string{"spec"}, "volumes", []corev1.Volume{vol})
		case !isUUIDVolume(pod.Spec.Volumes[i]):
			return nil, refuse("the pod has a volume named %q that is not the injector's (a downward-API file %s with metadata.uid): rename it, or set %s yourself", UUIDVolume, UUIDFileName, EnvUUIDFile)
		}
	}
	if sgx && !slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == in.cfg.SGXResource || (t.Key == "" && t.Operator == corev1.TolerationOpExists)
	}) {
		tol := corev1.Toleration{Key: in.cfg.SGXResource, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
		ops = appendList(ops, get(doc, "spec"), []string{"spec"}, "tolerations", []corev1.Toleration{tol})
	}
	return ops, nil
}

func isUUIDVolume(v corev1.Volume) bool {
	d := v.DownwardAPI
	return d != nil && slices.ContainsFunc(d.Items, func(f corev1.DownwardAPIVolumeFile) bool {
		return f.Path == UUIDFileName && f.FieldRef != nil && f.FieldRef.FieldPath == "metadata.uid"
	})
}

// resourceOps sets the device plugin's resources the container does not
// request yet. Extended resources cannot be overcommitted: Kubernetes
// takes an absent request to be the limit, and needs a limit equal to a
// request that is set, so a request without a limit gets its own value as
// the limit.
func (in *Injector) resourceOps(c corev1.Container, cdoc any, base []string) []Op {
	var ops []Op
	limits := map[string]any{}
	for _, l := range in.sgxLimits() {
		name := corev1.ResourceName(l[0])
		if _, ok := c.Resources.Limits[name]; ok {
			continue
		}
		value := l[1]
		if req, ok := c.Resources.Requests[name]; ok {
			value = req.String()
		}
		limits[l[0]] = value
	}
	if len(limits) == 0 {
		return nil
	}
	res := append(slices.Clone(base), "resources")
	switch {
	case get(cdoc, "resources") == nil:
		return append(ops, Op{"add", pointer(res...), map[string]any{"limits": limits}})
	case get(cdoc, "resources", "limits") == nil:
		return append(ops, Op{"add", pointer(append(res, "limits")...), limits})
	}
	for _, l := range in.sgxLimits() {
		if v, ok := limits[l[0]]; ok {
			ops = append(ops, Op{"add", pointer(append(res, "limits", l[0])...), v})
		}
	}
	return ops
}

// appendList adds items to the list field of the object at path: the
// whole list when the field is absent (or null), else one operation per
// item at its end.
func appendList[T any](ops []Op, obj any, path []string, field string, items []T) []Op {
	if len(items) == 0 {
		return ops
	}
	p := append(slices.Clone(path), field)
	if get(obj, field) == nil {
		return append(ops, Op{"add", pointer(p...), items})
	}
	for _, it := range items {
		ops = append(ops, Op{"add", pointer(p...) + "/-", it})
	}
	return ops
}

// get walks decoded JSON along object keys and list indexes (as strings).
func get(v any, path ...string) any {
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// Review answers an admission.k8s.io/v1 AdmissionReview request: the patch
// for a Pod being created, a refusal for a Pod the injector cannot
// mutate, and an unchanged admission for anything else. A body that is
// not such a request gets ErrBadReview.
func (in *Injector) Review(body []byte) ([]byte, *admissionv1.AdmissionResponse, error) {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrBadReview, err)
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return nil, nil, fmt.Errorf("%w: apiVersion %q, kind %q (the webhook's admissionReviewVersions must be [v1])", ErrBadReview, review.APIVersion, review.Kind)
	}
	req := review.Request
	if req == nil || req.UID == "" {
		return nil, nil, fmt.Errorf("%w: no request or no request uid", ErrBadReview)
	}
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	isPod := req.Kind.Group == "" && req.Kind.Kind == "Pod" && req.SubResource == ""
	if isPod && req.Operation == admissionv1.Create {
		ops, err := in.Patch(req.Object.Raw, req.Namespace)
		var refusal *RefusalError
		switch {
		case errors.As(err, &refusal):
			resp.Allowed = false
			resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: 400, Reason: metav1.StatusReasonBadRequest, Message: refusal.Error()}
		case err != nil:
			return nil, nil, err
		case len(ops) > 0:
			patch, err := json.Marshal(ops)
			if err != nil {
				return nil, nil, fmt.Errorf("encoding the patch: %w", err)
			}
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = patch, &pt
		}
	}
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the review: %w", err)
	}
	return out, resp, nil
}
