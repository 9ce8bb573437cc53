// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	k8sjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"
)

// ---------------------------------------------------------------------------
// deploy/kubernetes: plain manifests for `kubectl apply -k`, checked
// statically since no cluster runs where the tests do.

const (
	kubeDir           = "kubernetes"
	kustomizationFile = "kustomization.yaml"
	// exampleSuffix marks a file that documents an object the platform team
	// creates itself (the database Secret): checked, never applied.
	exampleSuffix = ".example.yaml"
	hostnameKey   = "kubernetes.io/hostname"

	defaultShutdownTimeout = 20 * time.Second // cmd/server --shutdown-timeout
	defaultGracePeriod     = 30               // Kubernetes' terminationGracePeriodSeconds
	defaultListen          = ":8080"          // cmd/server --listen

	// The server's mutual TLS material: a Secret of this name, mounted
	// read-only, with the kubernetes.io/tls keys plus ca.crt.
	tlsSecretName = "ipam-server-tls"
)

// tlsEnv maps each TLS variable the Deployment must set to the key of the
// TLS Secret its file must be.
var tlsEnv = map[string]string{
	"IPAM_TLS_CERT_FILE":  "tls.crt",
	"IPAM_TLS_KEY_FILE":   "tls.key",
	"IPAM_CLIENT_CA_FILE": "ca.crt",
}

// knownKinds maps each kind the manifests may hold to its apiVersion: no
// CRDs, nothing cluster-scoped but the Namespace, no removed API versions.
var knownKinds = map[string]string{
	"Namespace":           "v1",
	"ServiceAccount":      "v1",
	"Secret":              "v1",
	"Service":             "v1",
	"Deployment":          "apps/v1",
	"PodDisruptionBudget": "policy/v1",
}

// kustomization is the whole of what kustomization.yaml may say: a field
// the checks do not model (images, patches, generators) would change what
// is applied behind their back, so it is refused. (Kustomize's own types
// live outside k8s.io/api, in a module the project does not otherwise need.)
type kustomization struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Namespace  string   `yaml:"namespace"`
	Resources  []string `yaml:"resources"`
}

// kubeObject is one document of a manifest: Object is the document decoded
// into its k8s.io/api type (*appsv1.Deployment, *corev1.Secret, ...), or,
// for a kind client-go does not know, into a PartialObjectMetadata.
type kubeObject struct {
	metav1.TypeMeta
	Metadata metav1.ObjectMeta
	Object   runtime.Object

	file string
	doc  int // from 1
}

func (o kubeObject) String() string {
	return fmt.Sprintf("%s: %s %q", o.file, cmp.Or(o.Kind, "object"), o.Metadata.Name)
}

// selects reports whether a non-empty selector selects labels.
func selects(s *metav1.LabelSelector, l map[string]string) bool {
	if s == nil || len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	return err == nil && sel.Matches(labels.Set(l))
}

// parseManifest reads every document of a multi-document YAML file into its
// k8s.io/api type, strictly: an unknown or duplicate field is an error, as
// for kubectl apply. Documents are split, and duplicate keys and mistyped
// scalars found, on the YAML nodes, which know their lines; the decode goes
// through JSON (sigs.k8s.io/yaml), as the API server's does. An object
// whose decode stopped early is left out, with its error.
func parseManifest(file, src string) ([]kubeObject, error) {
	var objs []kubeObject
	var errs []error
	dec := yaml.NewDecoder(strings.NewReader(src))
	for doc := 1; ; doc++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil { // the decoder cannot resume after a syntax error
			errs = append(errs, fmt.Errorf("%s: document %d: %w", file, doc, err))
			break
		}
		root := &n
		if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
			root = root.Content[0]
		}
		if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
			continue // an empty document, as after a trailing ---
		}
		if root.Kind != yaml.MappingNode {
			errs = append(errs, fmt.Errorf("%s: document %d is not a mapping", file, doc))
			continue
		}
		if err := duplicateKeys(root); err != nil {
			errs = append(errs, fmt.Errorf("%s: document %d: %w", file, doc, err))
			continue
		}
		o, usable, err := decodeObject(root)
		o.file, o.doc = file, doc
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: document %d: %w", file, doc, err))
		}
		if usable {
			objs = append(objs, o)
		}
	}
	if len(objs) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%s holds no object", file))
	}
	return objs, errors.Join(errs...)
}

// decodeObject decodes one document's mapping into the type client-go's
// scheme has for its apiVersion and kind. A type error leaves the rest
// decoded (usable), so that the other checks still run; an error that stops
// the decode does not.
func decodeObject(root *yaml.Node) (o kubeObject, usable bool, err error) {
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch k, v := root.Content[i].Value, root.Content[i+1]; k {
		case "apiVersion":
			o.APIVersion = v.Value
		case "kind":
			o.Kind = v.Value
		}
	}
	obj, err := scheme.Scheme.New(schema.FromAPIVersionAndKind(o.APIVersion, o.Kind))
	known := err == nil
	if !known {
		obj = &metav1.PartialObjectMetadata{}
	}
	errs := checkScalars(root, reflect.TypeOf(obj), "")
	y, err := yaml.Marshal(root)
	if err != nil {
		return o, false, errors.Join(append(errs, err)...)
	}
	j, err := sigsyaml.YAMLToJSON(y)
	if err != nil {
		return o, false, errors.Join(append(errs, err)...)
	}
	if known {
		var strict []error
		strict, err = k8sjson.UnmarshalStrict(j, obj)
		errs = append(errs, strict...)
	} else {
		err = k8sjson.UnmarshalCaseSensitivePreserveInts(j, obj)
	}
	var te *json.UnmarshalTypeError
	usable = err == nil || errors.As(err, &te)
	errs = append(errs, err)
	if usable {
		o.Object = obj
		if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
			if meta, ok := m.GetObjectMeta().(*metav1.ObjectMeta); ok {
				o.Metadata = *meta
			}
		}
	}
	return o, usable, errors.Join(errs...)
}

var (
	quantityType    = reflect.TypeFor[resource.Quantity]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// checkScalars walks the YAML under n along t, the Go type it decodes
// into, and reports with line numbers what the decode would hide or stop
// at:
//   - a scalar that YAML reads as a bool or a number where Kubernetes wants
//     a string: the API server refuses prometheus.io/scrape: true, where a
//     YAML-to-Go decoder converts it. It is retagged as a string, so that
//     the decode does not report it again;
//   - a value the field's own decoder refuses (a quantity such as 256MB),
//     which would stop the decode. It is removed, so that the decode reads
//     the rest.
func checkScalars(n *yaml.Node, t reflect.Type, path string) []error {
	errs, _ := walkScalars(n, t, path)
	return errs
}

// walkScalars is checkScalars; drop reports that n must be removed.
func walkScalars(n *yaml.Node, t reflect.Type, path string) (errs []error, drop bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode || n.ShortTag() == "!!null" {
		return nil, false
	}
	switch {
	case t == quantityType:
		q, err := resource.ParseQuantity(n.Value)
		if n.Kind != yaml.ScalarNode || err != nil {
			return []error{fmt.Errorf("line %d: %s: %q is not a quantity (250m, 2, 256Mi)", n.Line, path, n.Value)}, true
		}
		if q.Sign() < 0 {
			return []error{fmt.Errorf("line %d: %s: %q is negative", n.Line, path, n.Value)}, false
		}
		return nil, false
	case reflect.PointerTo(t).Implements(unmarshalerType): // IntOrString, Time: their own decoders
		y, err := yaml.Marshal(n)
		if err == nil {
			var j []byte
			if j, err = sigsyaml.YAMLToJSON(y); err == nil {
				err = json.Unmarshal(j, reflect.New(t).Interface())
			}
		}
		if err != nil {
			return []error{fmt.Errorf("line %d: %s: %q: %w", n.Line, path, n.Value, err)}, true
		}
		return nil, false
	}
	switch t.Kind() {
	case reflect.String:
		if n.Kind == yaml.ScalarNode && n.ShortTag() != "!!str" {
			errs = append(errs, fmt.Errorf("line %d: %q is a %s, not a string: quote it", n.Line, n.Value, n.ShortTag()))
			n.Tag, n.Style = "!!str", yaml.DoubleQuotedStyle
		}
	case reflect.Struct, reflect.Map:
		if n.Kind != yaml.MappingNode {
			return nil, false
		}
		for i := 0; i+1 < len(n.Content); {
			key := n.Content[i].Value
			ft, ok := t, true
			if t.Kind() == reflect.Map {
				ft = t.Elem()
			} else {
				ft, ok = jsonField(t, key)
			}
			if ok {
				e, d := walkScalars(n.Content[i+1], ft, joinPath(path, key))
				errs = append(errs, e...)
				if d {
					n.Content = slices.Delete(n.Content, i, i+2)
					continue
				}
			}
			i += 2
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode || t.Elem().Kind() == reflect.Uint8 { // []byte is base64 text
			return nil, false
		}
		for i := 0; i < len(n.Content); {
			e, d := walkScalars(n.Content[i], t.Elem(), fmt.Sprintf("%s[%d]", path, i))
			errs = append(errs, e...)
			if d {
				n.Content = slices.Delete(n.Content, i, i+1)
				continue
			}
			i++
		}
	}
	return errs, false
}

// jsonField returns the type of the field of struct t whose JSON name is
// name, looking into inlined structs (metav1.TypeMeta, corev1.VolumeSource).
func jsonField(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" && (f.Anonymous || slices.Contains(strings.Split(opts, ","), "inline")) {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if inner, ok := jsonField(ft, name); ok {
					return inner, true
				}
			}
			continue
		}
		if cmp.Or(tag, f.Name) == name {
			return f.Type, true
		}
	}
	return nil, false
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// duplicateKeys reports a mapping key given twice anywhere under n, which
// a yaml.Node keeps silently (kubectl refuses it).
func duplicateKeys(n *yaml.Node) error {
	var errs []error
	if n.Kind == yaml.MappingNode {
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if line, dup := seen[k.Value]; dup {
				errs = append(errs, fmt.Errorf("line %d: key %q already given at line %d", k.Line, k.Value, line))
			}
			seen[k.Value] = k.Line
		}
	}
	for _, c := range n.Content {
		errs = append(errs, duplicateKeys(c))
	}
	return errors.Join(errs...)
}

func parseKustomization(src string) (kustomization, error) {
	var k kustomization
	dec := yaml.NewDecoder(strings.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&k); err != nil {
		return k, fmt.Errorf("%s: %w (fields other than apiVersion, kind, namespace and resources belong in an overlay that uses this directory as a base)", kustomizationFile, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return k, fmt.Errorf("%s holds more than one document", kustomizationFile)
	}
	return k, nil
}

// kubeSummary is what checkKubernetes learnt, for cross-checks.
type kubeSummary struct {
	objects   []kubeObject // those kustomization.yaml applies
	httpsPort int32        // the server container's port named https
}

// checkKubernetes reports every problem with the manifests of one
// directory, given as file name -> content.
func checkKubernetes(files map[string]string) (kubeSummary, error) {
	var sum kubeSummary
	var errs []error
	kSrc, ok := files[kustomizationFile]
	if !ok {
		return sum, fmt.Errorf("no %s", kustomizationFile)
	}
	k, err := parseKustomization(kSrc)
	if err != nil {
		errs = append(errs, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		errs = append(errs, fmt.Errorf("%s: apiVersion %q kind %q; want kustomize.config.k8s.io/v1beta1 Kustomization", kustomizationFile, k.APIVersion, k.Kind))
	}
	errs = append(errs, checkListing(k, files))

	var all []kubeObject
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if name == kustomizationFile || !isYAML(name) {
			continue
		}
		objs, err := parseManifest(name, files[name])
		errs = append(errs, err)
		all = append(all, objs...)
		if !strings.HasSuffix(name, exampleSuffix) && slices.Contains(k.Resources, name) {
			sum.objects = append(sum.objects, objs...)
		}
	}
	errs = append(errs, checkObjects(k, all))

	byKind := map[string][]kubeObject{}
	for _, o := range sum.objects {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	for _, kind := range []string{"Namespace", "ServiceAccount", "Deployment", "Service", "PodDisruptionBudget"} {
		if len(byKind[kind]) == 0 {
			errs = append(errs, fmt.Errorf("%s applies no %s", kustomizationFile, kind))
		}
	}
	if n := len(byKind["Deployment"]); n != 1 {
		if n > 1 {
			errs = append(errs, fmt.Errorf("%s applies %d Deployments; want the server's only", kustomizationFile, n))
		}
		return sum, errors.Join(errs...)
	}
	dep := byKind["Deployment"][0]
	d, ok := dep.Object.(*appsv1.Deployment)
	if !ok { // another apiVersion, reported by checkObjects
		return sum, errors.Join(errs...)
	}
	port, err := checkDeployment(dep, d.Spec, all, tlsSecretName)
	sum.httpsPort = port
	errs = append(errs, err)
	pod := d.Spec.Template.Spec
	podLabels := d.Spec.Template.Labels
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	for _, svc := range byKind["Service"] {
		errs = append(errs, checkService(svc, podLabels, pod))
	}
	for _, pdb := range byKind["PodDisruptionBudget"] {
		errs = append(errs, checkPDB(pdb, podLabels, replicas))
	}
	return sum, errors.Join(errs...)
}

func isYAML(name string) bool {
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}

// checkListing checks that the kustomization lists exactly the manifests
// present, examples excepted.
func checkListing(k kustomization, files map[string]string) error {
	var errs []error
	seen := map[string]bool{}
	for _, r := range k.Resources {
		_, present := files[r]
		switch {
		case seen[r]:
			errs = append(errs, fmt.Errorf("%s lists %q twice", kustomizationFile, r))
		case strings.HasSuffix(r, exampleSuffix):
			errs = append(errs, fmt.Errorf("%s lists the example %q, which must not be applied", kustomizationFile, r))
		case !present || !isYAML(r) || r == kustomizationFile:
			errs = append(errs, fmt.Errorf("%s lists %q, which is not a manifest file here", kustomizationFile, r))
		}
		seen[r] = true
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if isYAML(name) && name != kustomizationFile && !strings.HasSuffix(name, exampleSuffix) && !seen[name] {
			errs = append(errs, fmt.Errorf("%s does not list %q", kustomizationFile, name))
		}
	}
	return errors.Join(errs...)
}

// checkObjects checks what every object needs: a known kind and version, a
// name, the one namespace, and no duplicates.
func checkObjects(k kustomization, objs []kubeObject) error {
	var errs []error
	ns := k.Namespace
	var namespaces []string
	for _, o := range objs {
		if o.Kind == "Namespace" {
			namespaces = append(namespaces, o.Metadata.Name)
		}
	}
	switch {
	case ns == "" && len(namespaces) != 1:
		errs = append(errs, fmt.Errorf("%s sets no namespace, and the manifests hold %d Namespaces", kustomizationFile, len(namespaces)))
	case ns == "":
		ns = namespaces[0]
	case !slices.Contains(namespaces, ns):
		errs = append(errs, fmt.Errorf("no Namespace object %q, the namespace of %s", ns, kustomizationFile))
	}
	seen := map[string]string{}
	for _, o := range objs {
		where := fmt.Sprintf("%s: document %d", o.file, o.doc)
		if o.APIVersion == "" {
			errs = append(errs, fmt.Errorf("%s has no apiVersion", where))
		}
		if o.Kind == "" {
			errs = append(errs, fmt.Errorf("%s has no kind", where))
		}
		if o.Metadata.Name == "" {
			errs = append(errs, fmt.Errorf("%s has no metadata.name", where))
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			continue
		}
		if want, ok := knownKinds[o.Kind]; !ok {
			errs = append(errs, fmt.Errorf("%v: kind %s is not one of %v (no CRDs, no cluster-wide objects)", o, o.Kind, slices.Sorted(maps.Keys(knownKinds))))
		} else if o.APIVersion != want {
			errs = append(errs, fmt.Errorf("%v: apiVersion %q; want %q", o, o.APIVersion, want))
		}
		switch {
		case o.Kind == "Namespace" && o.Metadata.Namespace != "":
			errs = append(errs, fmt.Errorf("%v: a Namespace has no metadata.namespace", o))
		case o.Kind != "Namespace" && o.Metadata.Namespace == "":
			errs = append(errs, fmt.Errorf("%v has no metadata.namespace (want %q, so that `kubectl apply -f` agrees with -k)", o, ns))
		case o.Kind != "Namespace" && ns != "" && o.Metadata.Namespace != ns:
			errs = append(errs, fmt.Errorf("%v: namespace %q; want %q", o, o.Metadata.Namespace, ns))
		}
		id := o.Kind + "/" + o.Metadata.Name
		if prev, dup := seen[id]; dup {
			errs = append(errs, fmt.Errorf("%v: %s is also defined in %s", o, id, prev))
		}
		seen[id] = o.file
	}
	return errors.Join(errs...)
}

// checkDeployment checks the server's Deployment, whose TLS material is
// the Secret tlsSecret, and returns its container port named https.
func checkDeployment(dep kubeObject, d appsv1.DeploymentSpec, all []kubeObject, tlsSecret string) (int32, error) {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%v: "+format, append([]any{dep}, args...)...))
	}
	replicas := int32(1)
	if d.Replicas != nil {
		replicas = *d.Replicas
	}
	if replicas < 2 {
		fail("replicas %d; want at least 2, so that one node or rollout does not stop address allocation", replicas)
	}
	labels := d.Template.Labels
	if d.Selector == nil || len(d.Selector.MatchLabels) == 0 && len(d.Selector.MatchExpressions) == 0 {
		fail("spec.selector is empty")
	} else if !selects(d.Selector, labels) {
		fail("spec.selector does not select the pod template's labels %v", labels)
	}
	pod := d.Template.Spec

	// The service account exists; it gives the Pod a token exactly when the
	// server calls the Kubernetes API (IPAM_KUBE_IN_CLUSTER=true, which the
	// chart sets for its Kubernetes controllers).
	kube := len(pod.Containers) > 0 && slices.ContainsFunc(pod.Containers[0].Env, func(e corev1.EnvVar) bool {
		return e.Name == "IPAM_KUBE_IN_CLUSTER" && e.ValueFrom == nil && e.Value == "true"
	})
	if pod.ServiceAccountName == "" {
		fail("no serviceAccountName (the namespace's default account would be used)")
	} else {
		i := slices.IndexFunc(all, func(o kubeObject) bool {
			return o.Kind == "ServiceAccount" && o.Metadata.Name == pod.ServiceAccountName
		})
		mounted := i >= 0 && (isTrue(pod.AutomountServiceAccountToken) ||
			pod.AutomountServiceAccountToken == nil && !isFalse(serviceAccountAutomount(all[i])))
		switch {
		case i < 0:
			fail("serviceAccountName %q names no ServiceAccount here", pod.ServiceAccountName)
		case mounted && !kube:
			fail("mounts a service account token, which the server never uses: set automountServiceAccountToken: false")
		case !mounted && kube:
			fail("IPAM_KUBE_IN_CLUSTER is true, but the Pod gets no service account token to call the API with")
		}
	}
	if !isFalse(pod.EnableServiceLinks) {
		fail("enableServiceLinks is not false: Service links add IPAM_* variables the server does not own")
	}

	if len(pod.Containers) != 1 {
		fail("%d containers; want the server's only", len(pod.Containers))
		return 0, errors.Join(errs...)
	}
	c := pod.Containers[0]
	failC := func(format string, args ...any) {
		fail("container %q: "+format, append([]any{c.Name}, args...)...)
	}
	if c.Image == "" {
		failC("no image")
	} else if err := checkImageTag(c.Image); err != nil {
		failC("%v", err)
	}
	if len(c.Command) > 0 {
		failC("command %v replaces the image's ENTRYPOINT /ipam-server", c.Command)
	}
	if !slices.Equal(c.Args, []string{"serve"}) {
		failC("args %v; want [serve] (settings go in IPAM_* variables, which these checks read)", c.Args)
	}

	env, err := checkEnv(c, all)
	if err != nil {
		failC("%v", err)
	}
	if err := checkTLS(c, pod, env, all, tlsSecret); err != nil {
		errs = append(errs, prefixErr(fmt.Sprintf("%v: container %q", dep, c.Name), err))
	}

	// Ports: the server listens on the one named https.
	var httpsPort int32
	names := map[string]bool{}
	for _, p := range c.Ports {
		if p.Name != "" && names[p.Name] {
			failC("port name %q used twice", p.Name)
		}
		names[p.Name] = true
		if p.Name == "https" {
			httpsPort = p.ContainerPort
		}
	}
	if httpsPort == 0 {
		failC("no container port named https")
	} else if _, lp, err := splitHostPort(cmp.Or(env["IPAM_LISTEN"], defaultListen)); err != nil {
		failC("IPAM_LISTEN: %v", err)
	} else if lp != strconv.Itoa(int(httpsPort)) {
		failC("IPAM_LISTEN %q listens on port %s, but the container port named https is %d", cmp.Or(env["IPAM_LISTEN"], defaultListen), lp, httpsPort)
	}

	// Probes.
	for _, p := range []struct {
		field, want string
		probe       *corev1.Probe
	}{
		{"startupProbe", "/healthz", c.StartupProbe},
		{"livenessProbe", "/healthz", c.LivenessProbe},
		{"readinessProbe", "/readyz", c.ReadinessProbe},
	} {
		switch {
		case p.probe == nil:
			failC("no %s", p.field)
		case p.probe.HTTPGet == nil:
			failC("%s is not an httpGet", p.field)
		default:
			if p.probe.HTTPGet.Path != p.want {
				failC("%s path %q; want %q", p.field, p.probe.HTTPGet.Path, p.want)
			}
			if err := findPort(c, p.probe.HTTPGet.Port, true); err != nil {
				failC("%s port: %v", p.field, err)
			}
			if p.probe.HTTPGet.Scheme != "HTTPS" {
				failC("%s scheme %q; want HTTPS (the server speaks TLS only)", p.field, p.probe.HTTPGet.Scheme)
			}
		}
	}

	// Termination: the preStop sleep, then SIGTERM and the server's drain,
	// all within the grace period.
	var preStop int64
	var ps *corev1.LifecycleHandler
	if c.Lifecycle != nil {
		ps = c.Lifecycle.PreStop
	}
	switch {
	case ps == nil:
		failC("no preStop sleep: requests still routed to a terminating pod would fail")
	case ps.Exec != nil:
		failC("preStop exec %v: the distroless image has no shell nor sleep; use preStop.sleep", ps.Exec.Command)
	case ps.Sleep == nil || ps.Sleep.Seconds <= 0:
		failC("preStop is not a sleep of some seconds")
	default:
		preStop = ps.Sleep.Seconds
	}
	shutdown := defaultShutdownTimeout
	if v, ok := env["IPAM_SHUTDOWN_TIMEOUT"]; ok {
		if shutdown, err = time.ParseDuration(v); err != nil || shutdown <= 0 {
			failC("IPAM_SHUTDOWN_TIMEOUT %q is not a positive duration", v)
		}
	}
	grace := int64(defaultGracePeriod)
	if pod.TerminationGracePeriodSeconds != nil {
		grace = *pod.TerminationGracePeriodSeconds
	}
	if need := time.Duration(preStop)*time.Second + shutdown; time.Duration(grace)*time.Second <= need {
		fail("terminationGracePeriodSeconds %d is not more than the preStop sleep (%ds) plus IPAM_SHUTDOWN_TIMEOUT (%s): the kubelet would kill mid-drain",
			grace, preStop, shutdown)
	}

	errs = append(errs, prefixErr(fmt.Sprintf("%v: container %q", dep, c.Name), checkSecurity(pod.SecurityContext, c.SecurityContext)))
	errs = append(errs, prefixErr(fmt.Sprintf("%v: container %q", dep, c.Name), checkResources(c)))

	// Spread across nodes.
	spread := false
	for i, tsc := range pod.TopologySpreadConstraints {
		if !selects(tsc.LabelSelector, labels) {
			fail("topologySpreadConstraints[%d] (%s): labelSelector does not select the pods", i, tsc.TopologyKey)
		} else if tsc.TopologyKey == hostnameKey {
			spread = true
		}
	}
	var terms []corev1.PodAffinityTerm
	if pod.Affinity != nil && pod.Affinity.PodAntiAffinity != nil {
		aa := pod.Affinity.PodAntiAffinity
		terms = slices.Clone(aa.RequiredDuringSchedulingIgnoredDuringExecution)
		for _, p := range aa.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, p.PodAffinityTerm)
		}
	}
	for i, term := range terms {
		if !selects(term.LabelSelector, labels) {
			fail("podAntiAffinity term %d (%s): labelSelector does not select the pods", i, term.TopologyKey)
		} else if term.TopologyKey == hostnameKey {
			spread = true
		}
	}
	if !spread {
		fail("neither topologySpreadConstraints nor podAntiAffinity spreads the replicas across nodes (%s)", hostnameKey)
	}

	// Prometheus scraping.
	ann := d.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" {
		fail(`pod annotation prometheus.io/scrape is %q; want "true"`, ann["prometheus.io/scrape"])
	}
	if ann["prometheus.io/path"] != "/metrics" {
		fail(`pod annotation prometheus.io/path is %q; want "/metrics"`, ann["prometheus.io/path"])
	}
	if p := ann["prometheus.io/port"]; httpsPort != 0 && p != strconv.Itoa(int(httpsPort)) {
		fail("pod annotation prometheus.io/port is %q; want the https port %d", p, httpsPort)
	}
	if ann["prometheus.io/scheme"] != "https" {
		fail(`pod annotation prometheus.io/scheme is %q; want "https"`, ann["prometheus.io/scheme"])
	}
	return httpsPort, errors.Join(errs...)
}

func isFalse(b *bool) bool { return b != nil && !*b }
func isTrue(b *bool) bool  { return b != nil && *b }

func prefixErr(prefix string, err error) error {
	if err == nil {
		return nil
	}
	var errs []error
	for _, line := range strings.Split(err.Error(), "\n") {
		errs = append(errs, fmt.Errorf("%s: %s", prefix, line))
	}
	return errors.Join(errs...)
}

// checkEnv checks the container's environment: only variables the server
// reads, each once, and the database URL from a Secret documented here. It
// returns the literal values.
func checkEnv(c corev1.Container, all []kubeObject) (map[string]string, error) {
	var errs []error
	env := map[string]string{}
	seen := map[string]bool{}
	if len(c.EnvFrom) > 0 {
		errs = append(errs, errors.New("envFrom hides variable names from these checks: list each in env"))
	}
	for _, e := range c.Env {
		switch {
		case seen[e.Name]:
			errs = append(errs, fmt.Errorf("env %q set twice", e.Name))
		case !slices.Contains(serverEnv, e.Name):
			errs = append(errs, fmt.Errorf("env %q is not one the server reads (%v)", e.Name, serverEnv))
		}
		seen[e.Name] = true
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "IPAM_DATABASE_URL" })
	if i < 0 {
		return env, errors.Join(append(errs, errors.New("no IPAM_DATABASE_URL: the image has no PostgreSQL"))...)
	}
	db := c.Env[i]
	if db.ValueFrom == nil || db.ValueFrom.SecretKeyRef == nil {
		return env, errors.Join(append(errs, errors.New("IPAM_DATABASE_URL holds a password: take it from a Secret (valueFrom.secretKeyRef)"))...)
	}
	ref := db.ValueFrom.SecretKeyRef
	if isTrue(ref.Optional) {
		errs = append(errs, errors.New("IPAM_DATABASE_URL's secretKeyRef is optional: without it the server would start no database"))
	}
	j := slices.IndexFunc(all, func(o kubeObject) bool { return o.Kind == "Secret" && o.Metadata.Name == ref.Name })
	if j < 0 {
		return env, errors.Join(append(errs, fmt.Errorf("IPAM_DATABASE_URL comes from Secret %q, which no file here (%s) documents", ref.Name, "secret"+exampleSuffix))...)
	}
	if !secretHolds(all[j], ref.Key) {
		errs = append(errs, fmt.Errorf("IPAM_DATABASE_URL comes from key %q of Secret %q, which %s does not hold", ref.Key, ref.Name, all[j].file))
	}
	return env, errors.Join(errs...)
}

// checkTLS checks that the server speaks mutual TLS: IPAM_INSECURE_HTTP
// unset, and each of tlsEnv a file of a read-only mount of the Secret
// tlsSecret, which a file here documents with that key.
func checkTLS(c corev1.Container, pod corev1.PodSpec, env map[string]string, all []kubeObject, tlsSecret string) error {
	var errs []error
	if slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "IPAM_INSECURE_HTTP" }) {
		errs = append(errs, errors.New("IPAM_INSECURE_HTTP is set: the API would be served over plain HTTP without authentication"))
	}
	j := slices.IndexFunc(all, func(o kubeObject) bool { return o.Kind == "Secret" && o.Metadata.Name == tlsSecret })
	if j < 0 {
		errs = append(errs, fmt.Errorf("no file here (tls%s) documents the Secret %q", exampleSuffix, tlsSecret))
	}
	for _, name := range slices.Sorted(maps.Keys(tlsEnv)) {
		key := tlsEnv[name]
		file, ok := env[name]
		if !ok {
			errs = append(errs, fmt.Errorf("no %s (a literal value): want the file %s of the Secret %q", name, key, tlsSecret))
			continue
		}
		if err := checkSecretFile(c, pod, file, key, tlsSecret); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, file, err))
		}
		if j >= 0 && !secretHolds(all[j], key) {
			errs = append(errs, fmt.Errorf("%s reads key %q of Secret %q, which %s does not hold", name, key, tlsSecret, all[j].file))
		}
	}
	return errors.Join(errs...)
}

// checkSecretFile checks that file is key of the Secret tlsSecret, as
// mounted read-only (the whole Secret, not optional) into c.
func checkSecretFile(c corev1.Container, pod corev1.PodSpec, file, key, tlsSecret string) error {
	if !filepath.IsAbs(file) {
		return errors.New("not an absolute path")
	}
	for _, m := range c.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, file)
		if m.MountPath == "" || err != nil || rel == ".." || strings.HasPrefix(rel, "../") || rel == "." {
			continue
		}
		if m.SubPath != "" {
			return fmt.Errorf("is under the mount of volume %q at %s, which has a subPath", m.Name, m.MountPath)
		}
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		switch {
		case i < 0:
			return fmt.Errorf("is under the mount %s of volume %q, which the pod does not define", m.MountPath, m.Name)
		case pod.Volumes[i].Secret == nil:
			return fmt.Errorf("is under the mount %s of volume %q, which is not a Secret volume", m.MountPath, m.Name)
		}
		sv := pod.Volumes[i].Secret
		var errs []error
		if sv.SecretName != tlsSecret {
			errs = append(errs, fmt.Errorf("volume %q mounts Secret %q; want %q", m.Name, sv.SecretName, tlsSecret))
		}
		if isTrue(sv.Optional) {
			errs = append(errs, fmt.Errorf("volume %q is optional: without the Secret the server could not start", m.Name))
		}
		if len(sv.Items) > 0 {
			errs = append(errs, fmt.Errorf("volume %q lists items: mount the whole Secret", m.Name))
		}
		if !m.ReadOnly {
			errs = append(errs, fmt.Errorf("the mount %s of volume %q is not readOnly", m.MountPath, m.Name))
		}
		if rel != key {
			errs = append(errs, fmt.Errorf("is file %q of the mount %s; want %q", rel, m.MountPath, key))
		}
		return errors.Join(errs...)
	}
	return fmt.Errorf("is under no volume mount of container %q", c.Name)
}

// findPort checks that v names (or, unless byName, numbers) a port of c.
func findPort(c corev1.Container, v intstr.IntOrString, byName bool) error {
	isInt := v.Type == intstr.Int
	var names []string
	for _, p := range c.Ports {
		names = append(names, p.Name)
		if !isInt && p.Name == v.StrVal || isInt && !byName && p.ContainerPort == v.IntVal {
			return nil
		}
	}
	if isInt && byName {
		return fmt.Errorf("%d is a number; name a container port (%v) so that the two cannot drift apart", v.IntVal, names)
	}
	name := strconv.Itoa(int(v.IntVal))
	if !isInt {
		name = strconv.Quote(v.StrVal)
	}
	return fmt.Errorf("%s names no port of container %q (%v)", name, c.Name, names)
}

// checkSecurity checks a container's effective security context: the
// pod's, with the container's fields taking precedence.
func checkSecurity(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) error {
	var errs []error
	pod, c = cmp.Or(pod, &corev1.PodSecurityContext{}), cmp.Or(c, &corev1.SecurityContext{})
	runAsNonRoot, runAsUser, seccomp := cmp.Or(c.RunAsNonRoot, pod.RunAsNonRoot), cmp.Or(c.RunAsUser, pod.RunAsUser), cmp.Or(c.SeccompProfile, pod.SeccompProfile)
	if !isTrue(runAsNonRoot) {
		errs = append(errs, errors.New("runAsNonRoot is not true"))
	}
	switch {
	case runAsUser == nil:
		errs = append(errs, errors.New("no runAsUser: the image's USER is a name (nonroot), which the kubelet cannot check against runAsNonRoot; give its uid 65532"))
	case *runAsUser == 0:
		errs = append(errs, errors.New("runAsUser is 0 (root)"))
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		var typ corev1.SeccompProfileType
		if seccomp != nil {
			typ = seccomp.Type
		}
		errs = append(errs, fmt.Errorf("seccompProfile.type %q; want RuntimeDefault", typ))
	}
	if !isTrue(c.ReadOnlyRootFilesystem) {
		errs = append(errs, errors.New("readOnlyRootFilesystem is not true"))
	}
	if !isFalse(c.AllowPrivilegeEscalation) {
		errs = append(errs, errors.New("allowPrivilegeEscalation is not false"))
	}
	if isTrue(c.Privileged) {
		errs = append(errs, errors.New("privileged"))
	}
	caps := cmp.Or(c.Capabilities, &corev1.Capabilities{})
	if !slices.Contains(caps.Drop, "ALL") {
		errs = append(errs, fmt.Errorf("capabilities.drop %v does not drop ALL", caps.Drop))
	}
	if len(caps.Add) > 0 {
		errs = append(errs, fmt.Errorf("capabilities.add %v: the server needs none", caps.Add))
	}
	return errors.Join(errs...)
}

// checkResources checks that the container requests CPU and memory, has a
// memory limit, and requests no more than its limits. (parseManifest has
// already refused a value that is not a quantity.)
func checkResources(c corev1.Container) error {
	var errs []error
	req, lim := c.Resources.Requests, c.Resources.Limits
	for _, need := range []struct {
		kind string
		name corev1.ResourceName
	}{{"requests", corev1.ResourceCPU}, {"requests", corev1.ResourceMemory}, {"limits", corev1.ResourceMemory}} {
		m := req
		if need.kind == "limits" {
			m = lim
		}
		if _, ok := m[need.name]; !ok {
			errs = append(errs, fmt.Errorf("resources.%s.%s is unset", need.kind, need.name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(lim)) {
		r, l := req[name], lim[name]
		if _, ok := req[name]; ok && r.Cmp(l) > 0 {
			errs = append(errs, fmt.Errorf("resources.requests.%s %s is more than its limit %s", name, r.String(), l.String()))
		}
	}
	return errors.Join(errs...)
}

// checkService checks that a Service is a ClusterIP one that selects the
// server's pods and targets their named ports.
func checkService(svc kubeObject, podLabels map[string]string, pod corev1.PodSpec) error {
	o, ok := svc.Object.(*corev1.Service)
	if !ok {
		return nil // another apiVersion, reported by checkObjects
	}
	s := o.Spec
	errs := []error{}
	if s.Type != "" && s.Type != corev1.ServiceTypeClusterIP {
		errs = append(errs, fmt.Errorf("%v: type %s; want ClusterIP (in-cluster callers only)", svc, s.Type))
	}
	if len(s.Selector) == 0 {
		errs = append(errs, fmt.Errorf("%v has no selector", svc))
	} else if !labels.SelectorFromSet(s.Selector).Matches(labels.Set(podLabels)) {
		errs = append(errs, fmt.Errorf("%v: selector %v does not select the Deployment's pods %v", svc, s.Selector, podLabels))
	}
	if len(s.Ports) == 0 {
		errs = append(errs, fmt.Errorf("%v has no ports", svc))
	}
	for _, p := range s.Ports {
		switch {
		case p.TargetPort == intstr.IntOrString{}:
			errs = append(errs, fmt.Errorf("%v: port %d has no targetPort: name a container port", svc, p.Port))
		case len(pod.Containers) == 1:
			if err := findPort(pod.Containers[0], p.TargetPort, true); err != nil {
				errs = append(errs, fmt.Errorf("%v: port %d targetPort: %w", svc, p.Port, err))
			}
		}
	}
	return errors.Join(errs...)
}

// checkPDB checks that a PodDisruptionBudget selects the server's pods and
// lets at least one of them be evicted.
func checkPDB(pdb kubeObject, podLabels map[string]string, replicas int32) error {
	o, ok := pdb.Object.(*policyv1.PodDisruptionBudget)
	if !ok {
		return nil // another apiVersion, reported by checkObjects
	}
	s := o.Spec
	errs := []error{}
	if s.Selector == nil || len(s.Selector.MatchLabels) == 0 && len(s.Selector.MatchExpressions) == 0 {
		errs = append(errs, fmt.Errorf("%v has no selector (it would cover every pod of the namespace)", pdb))
	} else if !selects(s.Selector, podLabels) {
		errs = append(errs, fmt.Errorf("%v: selector does not select the Deployment's pods %v", pdb, podLabels))
	}
	minInt := s.MinAvailable != nil && s.MinAvailable.Type == intstr.Int
	switch {
	case s.MinAvailable == nil && s.MaxUnavailable == nil:
		errs = append(errs, fmt.Errorf("%v has neither minAvailable nor maxUnavailable", pdb))
	case s.MinAvailable != nil && s.MaxUnavailable != nil:
		errs = append(errs, fmt.Errorf("%v has both minAvailable and maxUnavailable", pdb))
	case minInt && s.MinAvailable.IntVal >= replicas:
		errs = append(errs, fmt.Errorf("%v: minAvailable %d of %d replicas: no pod could ever be evicted, and node drains would hang", pdb, s.MinAvailable.IntVal, replicas))
	case minInt && s.MinAvailable.IntVal < 1:
		errs = append(errs, fmt.Errorf("%v: minAvailable %d protects nothing", pdb, s.MinAvailable.IntVal))
	}
	return errors.Join(errs...)
}

// serviceAccountAutomount returns a ServiceAccount's
// automountServiceAccountToken (nil for another object).
func serviceAccountAutomount(o kubeObject) *bool {
	if sa, ok := o.Object.(*corev1.ServiceAccount); ok {
		return sa.AutomountServiceAccountToken
	}
	return nil
}

// secretHolds reports whether a Secret has key in data or stringData.
func secretHolds(o kubeObject, key string) bool {
	s, ok := o.Object.(*corev1.Secret)
	if !ok {
		return false
	}
	_, inData := s.Data[key]
	_, inStringData := s.StringData[key]
	return inData || inStringData
}

// ---------------------------------------------------------------------------
// Tests of this repository's manifests

// readKubeDir returns the regular files of dir, name -> content.
func readKubeDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		if e.Type().IsRegular() {
			files[e.Name()] = readFile(t, filepath.Join(dir, e.Name()))
		}
	}
	return files
}

func TestKubernetesManifests(t *testing.T) {
	sum, err := checkKubernetes(readKubeDir(t, filepath.Join(repoRoot(t), "deploy", kubeDir)))
	if err != nil {
		t.Fatalf("deploy/%s:\n%v", kubeDir, err)
	}
	if sum.httpsPort == 0 {
		t.Error("the Deployment has no https port")
	}
}

// TestKubectlKustomize renders the kustomization with kubectl, when a
// kubectl that runs is installed, and compares what it renders with what
// the static checks read. Without one, the static checks stand alone.
func TestKubectlKustomize(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("no kubectl: `kubectl kustomize` not run; the static checks stand alone")
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, kubectl, "version", "--client").CombinedOutput(); err != nil {
		t.Logf("kubectl does not run (%v: %s): `kubectl kustomize` not run; the static checks stand alone", err, bytes.TrimSpace(out))
		return
	}
	dir := filepath.Join(repoRoot(t), "deploy", kubeDir)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.Bytes())
	}
	rendered, err := parseManifest("kubectl kustomize output", string(out))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := checkKubernetes(readKubeDir(t, dir))
	if err != nil {
		t.Fatalf("deploy/%s:\n%v", kubeDir, err)
	}
	ids := func(objs []kubeObject) []string {
		var s []string
		for _, o := range objs {
			s = append(s, o.APIVersion+" "+o.Kind+" "+o.Metadata.Namespace+"/"+o.Metadata.Name)
		}
		slices.Sort(s)
		return s
	}
	if got, want := ids(rendered), ids(sum.objects); !slices.Equal(got, want) {
		t.Errorf("kubectl kustomize renders\n  %s\nbut the files hold\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// ---------------------------------------------------------------------------
// Tests that each check can fail

// goodKube is a small valid manifest directory.
var goodKube = map[string]string{
	kustomizationFile: `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: ipam
resources:
  - namespace.yaml
  - serviceaccount.yaml
  - deployment.yaml
  - service.yaml
  - pdb.yaml
`,
	"namespace.yaml": `apiVersion: v1
kind: Namespace
metadata:
  name: ipam
`,
	"serviceaccount.yaml": `apiVersion: v1
kind: ServiceAccount
metadata:
  name: ipam-server
  namespace: ipam
automountServiceAccountToken: false
`,
	"secret.example.yaml": `apiVersion: v1
kind: Secret
metadata:
  name: ipam-database
  namespace: ipam
stringData:
  IPAM_DATABASE_URL: postgres://ipam:x@db:5432/ipam
`,
	"tls.example.yaml": `apiVersion: v1
kind: Secret
metadata:
  name: ipam-server-tls
  namespace: ipam
type: kubernetes.io/tls
stringData:
  tls.crt: cert
  tls.key: key
  ca.crt: ca
`,
	"service.yaml": `apiVersion: v1
kind: Service
metadata:
  name: ipam-server
  namespace: ipam
spec:
  selector:
    app: ipam
  ports:
    - name: https
      port: 443
      targetPort: https
`,
	"pdb.yaml": `apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: ipam-server
  namespace: ipam
spec:
  minAvailable: 1
  selector:
    matchLabels:
      app: ipam
`,
	"deployment.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: ipam-server
  namespace: ipam
spec:
  replicas: 2
  selector:
    matchLabels:
      app: ipam
  template:
    metadata:
      labels:
        app: ipam
        tier: api
      annotations:
        prometheus.io/scrape: "true"
        prometheus.io/port: "8443"
        prometheus.io/path: /metrics
        prometheus.io/scheme: https
    spec:
      serviceAccountName: ipam-server
      enableServiceLinks: false
      terminationGracePeriodSeconds: 30
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        seccompProfile:
          type: RuntimeDefault
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector:
            matchLabels:
              app: ipam
      containers:
        - name: server
          image: ghcr.io/ipam-dev/ipam-server:0.1.0
          args: ["serve"]
          env:
            - name: IPAM_DATABASE_URL
              valueFrom:
                secretKeyRef:
                  name: ipam-database
                  key: IPAM_DATABASE_URL
            - name: IPAM_LISTEN
              value: ":8443"
            - name: IPAM_SHUTDOWN_TIMEOUT
              value: 20s
            - name: IPAM_TLS_CERT_FILE
              value: /etc/ipam/tls/tls.crt
            - name: IPAM_TLS_KEY_FILE
              value: /etc/ipam/tls/tls.key
            - name: IPAM_CLIENT_CA_FILE
              value: /etc/ipam/tls/ca.crt
          ports:
            - name: https
              containerPort: 8443
          startupProbe:
            httpGet: {path: /healthz, port: https, scheme: HTTPS}
          livenessProbe:
            httpGet: {path: /healthz, port: https, scheme: HTTPS}
          readinessProbe:
            httpGet: {path: /readyz, port: https, scheme: HTTPS}
          lifecycle:
            preStop:
              sleep:
                seconds: 5
          resources:
            requests: {cpu: 250m, memory: 256Mi}
            limits: {cpu: 2, memory: 256Mi}
          securityContext:
            readOnlyRootFilesystem: true
            allowPrivilegeEscalation: false
            capabilities:
              drop: [ALL]
          volumeMounts:
            - name: tls
              mountPath: /etc/ipam/tls
              readOnly: true
      volumes:
        - name: tls
          secret:
            secretName: ipam-server-tls
`,
}

// kubeEdit changes one file of goodKube: replaces old by new, or, with old
// empty, sets the whole file to new (deleting it when new is empty too).
type kubeEdit struct{ file, old, new string }

func TestCheckKubernetesFindsProblems(t *testing.T) {
	const (
		dep = "deployment.yaml"
		svc = "service.yaml"
		pdb = "pdb.yaml"
		kus = kustomizationFile
	)
	tests := []struct {
		name    string
		edits   []kubeEdit
		wantErr string // "" means valid
	}{
		{name: "valid"},
		{name: "pod anti-affinity instead of a spread constraint", edits: []kubeEdit{{dep,
			"      topologySpreadConstraints:\n        - maxSkew: 1\n          topologyKey: kubernetes.io/hostname\n          whenUnsatisfiable: DoNotSchedule\n          labelSelector:\n            matchLabels:\n              app: ipam\n",
			"      affinity:\n        podAntiAffinity:\n          preferredDuringSchedulingIgnoredDuringExecution:\n            - weight: 100\n              podAffinityTerm:\n                topologyKey: kubernetes.io/hostname\n                labelSelector:\n                  matchLabels: {app: ipam}\n"}}},
		{name: "two documents in one file", edits: []kubeEdit{
			{svc, "targetPort: https\n", "targetPort: https\n---\n" + goodKube[pdb] + "---\n"},
			{pdb, "", ""},
			{kus, "  - pdb.yaml\n", ""}}},
		{name: "image by digest", edits: []kubeEdit{{dep, "ipam-server:0.1.0", "ipam-server@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}},
		{name: "pod security context in the container", edits: []kubeEdit{{dep, "          securityContext:\n", "          securityContext:\n            runAsUser: 1000\n"}}},

		// Parsing.
		{name: "not YAML", edits: []kubeEdit{{svc, "  ports:\n", "  ports:\n\t- port: 81\n"}}, wantErr: "service.yaml: document 1: yaml:"},
		{name: "second document broken", edits: []kubeEdit{{svc, "", goodKube[svc] + "---\nkind: [\n"}}, wantErr: "service.yaml: document 2: yaml:"},
		{name: "duplicate key", edits: []kubeEdit{{pdb, "  minAvailable: 1\n", "  minAvailable: 1\n  minAvailable: 1\n"}}, wantErr: `pdb.yaml: document 1: line 8: key "minAvailable" already given at line 7`},
		{name: "duplicate key deep down", edits: []kubeEdit{{dep, "            seconds: 5\n", "            seconds: 5\n                seconds: 1\n"}}, wantErr: `key "seconds" already given`},
		{name: "document not a mapping", edits: []kubeEdit{{svc, "", "- a\n- b\n"}}, wantErr: "service.yaml: document 1 is not a mapping"},
		{name: "empty manifest", edits: []kubeEdit{{svc, "", "# nothing\n"}}, wantErr: "service.yaml holds no object"},
		{name: "bool annotation", edits: []kubeEdit{{dep, `prometheus.io/scrape: "true"`, "prometheus.io/scrape: true"}}, wantErr: `"true" is a !!bool, not a string`},
		{name: "number as env value", edits: []kubeEdit{{dep, "value: 20s", "value: 20"}}, wantErr: `"20" is a !!int, not a string`},
		{name: "misspelt field", edits: []kubeEdit{{dep, "readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true"}},
			wantErr: `unknown field "spec.template.spec.containers[0].securityContext.readOnlyRootFileSystem"`},
		{name: "field given twice in a flow mapping", edits: []kubeEdit{{dep, "{path: /readyz, port: https,", "{path: /readyz, path: /healthz, port: https,"}},
			wantErr: `key "path" already given`},
		{name: "string as replicas", edits: []kubeEdit{{dep, "replicas: 2", `replicas: "2"`}}, wantErr: "cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"},
		{name: "bool as a port", edits: []kubeEdit{{svc, "targetPort: https", "targetPort: true"}}, wantErr: `line 12: spec.ports[0].targetPort: "true"`},
		{name: "negative quantity", edits: []kubeEdit{{dep, "cpu: 250m", "cpu: -1"}}, wantErr: `spec.template.spec.containers[0].resources.requests.cpu: "-1" is negative`},

		// The kustomization.
		{name: "no kustomization", edits: []kubeEdit{{kus, "", ""}}, wantErr: "no kustomization.yaml"},
		{name: "file not listed", edits: []kubeEdit{{kus, "  - pdb.yaml\n", ""}}, wantErr: `kustomization.yaml does not list "pdb.yaml"`},
		{name: "listed file absent", edits: []kubeEdit{{kus, "  - pdb.yaml\n", "  - pdb.yaml\n  - hpa.yaml\n"}}, wantErr: `lists "hpa.yaml", which is not a manifest file here`},
		{name: "listed twice", edits: []kubeEdit{{kus, "  - pdb.yaml\n", "  - pdb.yaml\n  - pdb.yaml\n"}}, wantErr: `lists "pdb.yaml" twice`},
		{name: "example applied", edits: []kubeEdit{{kus, "  - pdb.yaml\n", "  - pdb.yaml\n  - secret.example.yaml\n"}}, wantErr: `lists the example "secret.example.yaml"`},
		{name: "unmodelled field", edits: []kubeEdit{{kus, "resources:", "images:\n  - name: x\n    newTag: latest\nresources:"}}, wantErr: "field images not found"},
		{name: "wrong kustomization kind", edits: []kubeEdit{{kus, "kind: Kustomization", "kind: Component"}}, wantErr: `kind "Component"`},

		// Every object.
		{name: "no apiVersion", edits: []kubeEdit{{svc, "apiVersion: v1\n", ""}}, wantErr: "service.yaml: document 1 has no apiVersion"},
		{name: "no kind", edits: []kubeEdit{{pdb, "kind: PodDisruptionBudget\n", ""}}, wantErr: "pdb.yaml: document 1 has no kind"},
		{name: "no name", edits: []kubeEdit{{svc, "  name: ipam-server\n", ""}}, wantErr: "service.yaml: document 1 has no metadata.name"},
		{name: "no namespace", edits: []kubeEdit{{svc, "  namespace: ipam\n", ""}}, wantErr: `Service "ipam-server" has no metadata.namespace`},
		{name: "another namespace", edits: []kubeEdit{{pdb, "namespace: ipam", "namespace: default"}}, wantErr: `namespace "default"; want "ipam"`},
		{name: "example in another namespace", edits: []kubeEdit{{"secret.example.yaml", "namespace: ipam", "namespace: kube-system"}}, wantErr: `namespace "kube-system"; want "ipam"`},
		{name: "no Namespace object", edits: []kubeEdit{{"namespace.yaml", "", ""}, {kus, "  - namespace.yaml\n", ""}}, wantErr: `no Namespace object "ipam"`},
		{name: "a CRD", edits: []kubeEdit{{"monitor.yaml", "", "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata:\n  name: ipam\n  namespace: ipam\n"},
			{kus, "  - pdb.yaml\n", "  - pdb.yaml\n  - monitor.yaml\n"}}, wantErr: "kind ServiceMonitor is not one of"},
		{name: "removed API version", edits: []kubeEdit{{pdb, "policy/v1", "policy/v1beta1"}}, wantErr: `apiVersion "policy/v1beta1"; want "policy/v1"`},
		{name: "duplicate object", edits: []kubeEdit{{svc, "", goodKube[svc] + "---\n" + goodKube[svc]}}, wantErr: "Service/ipam-server is also defined in service.yaml"},
		{name: "no PDB", edits: []kubeEdit{{pdb, "", ""}, {kus, "  - pdb.yaml\n", ""}}, wantErr: "applies no PodDisruptionBudget"},

		// The Deployment.
		{name: "one replica", edits: []kubeEdit{{dep, "replicas: 2", "replicas: 1"}}, wantErr: "replicas 1; want at least 2"},
		{name: "selector misses the template", edits: []kubeEdit{{dep, "    matchLabels:\n      app: ipam\n  template", "    matchLabels:\n      app: ipam-server\n  template"}},
			wantErr: "spec.selector does not select the pod template's labels"},
		{name: "unknown service account", edits: []kubeEdit{{dep, "serviceAccountName: ipam-server", "serviceAccountName: ipam"}}, wantErr: `serviceAccountName "ipam" names no ServiceAccount`},
		{name: "token mounted", edits: []kubeEdit{{"serviceaccount.yaml", "automountServiceAccountToken: false", "automountServiceAccountToken: true"}}, wantErr: "mounts a service account token"},
		{name: "API access without a token", edits: []kubeEdit{{dep, "            - name: IPAM_SHUTDOWN_TIMEOUT\n", "            - name: IPAM_KUBE_IN_CLUSTER\n              value: \"true\"\n            - name: IPAM_SHUTDOWN_TIMEOUT\n"}},
			wantErr: "IPAM_KUBE_IN_CLUSTER is true, but the Pod gets no service account token"},
		{name: "API access with a token", edits: []kubeEdit{
			{"serviceaccount.yaml", "automountServiceAccountToken: false", "automountServiceAccountToken: true"},
			{dep, "            - name: IPAM_SHUTDOWN_TIMEOUT\n", "            - name: IPAM_KUBE_IN_CLUSTER\n              value: \"true\"\n            - name: IPAM_SHUTDOWN_TIMEOUT\n"}}},
		{name: "service links", edits: []kubeEdit{{dep, "      enableServiceLinks: false\n", ""}}, wantErr: "enableServiceLinks is not false"},
		{name: "latest image", edits: []kubeEdit{{dep, "ipam-server:0.1.0", "ipam-server:latest"}}, wantErr: "uses the moving tag latest"},
		{name: "untagged image", edits: []kubeEdit{{dep, "ipam-server:0.1.0", "ipam-server"}}, wantErr: `image "ghcr.io/ipam-dev/ipam-server" has no tag`},
		{name: "registry port is no tag", edits: []kubeEdit{{dep, "ghcr.io/ipam-dev/ipam-server:0.1.0", "localhost:5000/ipam-server"}}, wantErr: "has no tag"},
		{name: "migrate instead of serve", edits: []kubeEdit{{dep, `args: ["serve"]`, `args: ["migrate"]`}}, wantErr: "args [migrate]; want [serve]"},
		{name: "command replaces the entrypoint", edits: []kubeEdit{{dep, `args: ["serve"]`, `command: ["/bin/sh"]` + "\n          " + `args: ["serve"]`}}, wantErr: "replaces the image's ENTRYPOINT"},
		{name: "misspelt env", edits: []kubeEdit{{dep, "name: IPAM_LISTEN", "name: IPAM_LISTN"}}, wantErr: `env "IPAM_LISTN" is not one the server reads`},
		{name: "env twice", edits: []kubeEdit{{dep, "            - name: IPAM_SHUTDOWN_TIMEOUT\n", "            - name: IPAM_LISTEN\n              value: \":8443\"\n            - name: IPAM_SHUTDOWN_TIMEOUT\n"}}, wantErr: `env "IPAM_LISTEN" set twice`},
		{name: "envFrom", edits: []kubeEdit{{dep, "          env:\n", "          envFrom:\n            - configMapRef: {name: ipam}\n          env:\n"}}, wantErr: "envFrom hides variable names"},
		{name: "database URL in the clear", edits: []kubeEdit{{dep,
			"              valueFrom:\n                secretKeyRef:\n                  name: ipam-database\n                  key: IPAM_DATABASE_URL\n",
			"              value: postgres://ipam:secret@db/ipam\n"}}, wantErr: "take it from a Secret"},
		{name: "no database URL", edits: []kubeEdit{{dep,
			"            - name: IPAM_DATABASE_URL\n              valueFrom:\n                secretKeyRef:\n                  name: ipam-database\n                  key: IPAM_DATABASE_URL\n", ""}}, wantErr: "no IPAM_DATABASE_URL"},
		{name: "undocumented Secret", edits: []kubeEdit{{dep, "name: ipam-database", "name: ipam-db"}}, wantErr: `Secret "ipam-db", which no file here`},
		{name: "Secret lacks the key", edits: []kubeEdit{{dep, "key: IPAM_DATABASE_URL", "key: url"}}, wantErr: `key "url" of Secret "ipam-database"`},
		{name: "optional Secret", edits: []kubeEdit{{dep, "key: IPAM_DATABASE_URL", "key: IPAM_DATABASE_URL\n                  optional: true"}}, wantErr: "secretKeyRef is optional"},
		{name: "no https port", edits: []kubeEdit{{dep, "- name: https\n              containerPort", "- name: api\n              containerPort"}}, wantErr: "no container port named https"},
		{name: "port named http only", edits: []kubeEdit{{dep, "- name: https\n              containerPort", "- name: http\n              containerPort"}}, wantErr: "no container port named https"},
		{name: "listens elsewhere", edits: []kubeEdit{{dep, `value: ":8443"`, `value: ":9090"`}}, wantErr: `IPAM_LISTEN ":9090" listens on port 9090, but the container port named https is 8443`},
		{name: "listens on the default port", edits: []kubeEdit{{dep, "            - name: IPAM_LISTEN\n              value: \":8443\"\n", ""}}, wantErr: `IPAM_LISTEN ":8080" listens on port 8080, but the container port named https is 8443`},
		{name: "liveness on readyz", edits: []kubeEdit{{dep, "livenessProbe:\n            httpGet: {path: /healthz", "livenessProbe:\n            httpGet: {path: /readyz"}}, wantErr: `livenessProbe path "/readyz"; want "/healthz"`},
		{name: "readiness on healthz", edits: []kubeEdit{{dep, "path: /readyz", "path: /healthz"}}, wantErr: `readinessProbe path "/healthz"; want "/readyz"`},
		{name: "no startup probe", edits: []kubeEdit{{dep, "          startupProbe:\n            httpGet: {path: /healthz, port: https, scheme: HTTPS}\n", ""}}, wantErr: "no startupProbe"},
		{name: "tcp probe", edits: []kubeEdit{{dep, "startupProbe:\n            httpGet: {path: /healthz, port: https, scheme: HTTPS}", "startupProbe:\n            tcpSocket: {port: https}"}}, wantErr: "startupProbe is not an httpGet"},
		{name: "probe port unknown", edits: []kubeEdit{{dep, "path: /readyz, port: https", "path: /readyz, port: metrics"}}, wantErr: `readinessProbe port: "metrics" names no port`},
		{name: "probe port by number", edits: []kubeEdit{{dep, "path: /readyz, port: https", "path: /readyz, port: 8443"}}, wantErr: "readinessProbe port: 8443 is a number"},
		{name: "probe over plain HTTP", edits: []kubeEdit{{dep, "path: /readyz, port: https, scheme: HTTPS", "path: /readyz, port: https, scheme: HTTP"}}, wantErr: `readinessProbe scheme "HTTP"; want HTTPS`},
		{name: "probe without scheme", edits: []kubeEdit{{dep, "startupProbe:\n            httpGet: {path: /healthz, port: https, scheme: HTTPS}", "startupProbe:\n            httpGet: {path: /healthz, port: https}"}}, wantErr: `startupProbe scheme ""; want HTTPS`},

		// Mutual TLS.
		{name: "insecure HTTP", edits: []kubeEdit{{dep, "            - name: IPAM_TLS_CERT_FILE\n", "            - name: IPAM_INSECURE_HTTP\n              value: \"true\"\n            - name: IPAM_TLS_CERT_FILE\n"}}, wantErr: "IPAM_INSECURE_HTTP is set"},
		{name: "insecure HTTP false", edits: []kubeEdit{{dep, "            - name: IPAM_TLS_CERT_FILE\n", "            - name: IPAM_INSECURE_HTTP\n              value: \"false\"\n            - name: IPAM_TLS_CERT_FILE\n"}}, wantErr: "IPAM_INSECURE_HTTP is set"},
		{name: "no client CA", edits: []kubeEdit{{dep, "            - name: IPAM_CLIENT_CA_FILE\n              value: /etc/ipam/tls/ca.crt\n", ""}}, wantErr: `no IPAM_CLIENT_CA_FILE (a literal value): want the file ca.crt of the Secret "ipam-server-tls"`},
		{name: "no certificate", edits: []kubeEdit{{dep, "            - name: IPAM_TLS_CERT_FILE\n              value: /etc/ipam/tls/tls.crt\n", ""}}, wantErr: "no IPAM_TLS_CERT_FILE"},
		{name: "key and certificate swapped", edits: []kubeEdit{{dep, "value: /etc/ipam/tls/tls.key", "value: /etc/ipam/tls/tls.crt"}}, wantErr: `IPAM_TLS_KEY_FILE "/etc/ipam/tls/tls.crt": is file "tls.crt" of the mount /etc/ipam/tls; want "tls.key"`},
		{name: "certificate outside the mount", edits: []kubeEdit{{dep, "value: /etc/ipam/tls/tls.crt", "value: /etc/ipam/tls.crt"}}, wantErr: `IPAM_TLS_CERT_FILE "/etc/ipam/tls.crt": is under no volume mount`},
		{name: "relative certificate path", edits: []kubeEdit{{dep, "value: /etc/ipam/tls/tls.crt", "value: tls/tls.crt"}}, wantErr: `IPAM_TLS_CERT_FILE "tls/tls.crt": not an absolute path`},
		{name: "no volume mount", edits: []kubeEdit{{dep, "          volumeMounts:\n            - name: tls\n              mountPath: /etc/ipam/tls\n              readOnly: true\n", ""}}, wantErr: "is under no volume mount"},
		{name: "mount not read-only", edits: []kubeEdit{{dep, "              readOnly: true\n", ""}}, wantErr: "the mount /etc/ipam/tls of volume \"tls\" is not readOnly"},
		{name: "mount of an undefined volume", edits: []kubeEdit{{dep, "      volumes:\n        - name: tls\n", "      volumes:\n        - name: certs\n"}}, wantErr: `volume "tls", which the pod does not define`},
		{name: "emptyDir instead of the Secret", edits: []kubeEdit{{dep, "          secret:\n            secretName: ipam-server-tls\n", "          emptyDir: {}\n"}}, wantErr: "which is not a Secret volume"},
		{name: "another Secret mounted", edits: []kubeEdit{{dep, "secretName: ipam-server-tls", "secretName: ipam-tls"}}, wantErr: `volume "tls" mounts Secret "ipam-tls"; want "ipam-server-tls"`},
		{name: "optional Secret volume", edits: []kubeEdit{{dep, "secretName: ipam-server-tls", "secretName: ipam-server-tls\n            optional: true"}}, wantErr: `volume "tls" is optional`},
		{name: "Secret volume items", edits: []kubeEdit{{dep, "secretName: ipam-server-tls", "secretName: ipam-server-tls\n            items: [{key: tls.crt, path: tls.crt}]"}}, wantErr: "lists items: mount the whole Secret"},
		{name: "subPath mount", edits: []kubeEdit{{dep, "              readOnly: true\n", "              readOnly: true\n              subPath: tls\n"}}, wantErr: "which has a subPath"},
		{name: "TLS Secret undocumented", edits: []kubeEdit{{"tls.example.yaml", "", ""}}, wantErr: `no file here (tls.example.yaml) documents the Secret "ipam-server-tls"`},
		{name: "TLS Secret lacks ca.crt", edits: []kubeEdit{{"tls.example.yaml", "  ca.crt: ca\n", ""}}, wantErr: `IPAM_CLIENT_CA_FILE reads key "ca.crt" of Secret "ipam-server-tls", which tls.example.yaml does not hold`},
		{name: "TLS example applied", edits: []kubeEdit{{kus, "  - pdb.yaml\n", "  - pdb.yaml\n  - tls.example.yaml\n"}}, wantErr: `lists the example "tls.example.yaml"`},
		{name: "grace period equals the shutdown timeout", edits: []kubeEdit{{dep, "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 20"}},
			wantErr: "terminationGracePeriodSeconds 20 is not more than the preStop sleep (5s) plus IPAM_SHUTDOWN_TIMEOUT (20s)"},
		{name: "shutdown timeout longer than the grace period", edits: []kubeEdit{{dep, "value: 20s", "value: 1m"}},
			wantErr: "terminationGracePeriodSeconds 30 is not more than the preStop sleep (5s) plus IPAM_SHUTDOWN_TIMEOUT (1m0s)"},
		{name: "default grace period, default shutdown timeout", edits: []kubeEdit{
			{dep, "      terminationGracePeriodSeconds: 30\n", ""},
			{dep, "            - name: IPAM_SHUTDOWN_TIMEOUT\n              value: 20s\n", ""},
			{dep, "seconds: 5", "seconds: 15"}},
			wantErr: "terminationGracePeriodSeconds 30 is not more than the preStop sleep (15s) plus IPAM_SHUTDOWN_TIMEOUT (20s)"},
		{name: "bad shutdown timeout", edits: []kubeEdit{{dep, "value: 20s", `value: "20"`}}, wantErr: `IPAM_SHUTDOWN_TIMEOUT "20" is not a positive duration`},
		{name: "no preStop", edits: []kubeEdit{{dep, "          lifecycle:\n            preStop:\n              sleep:\n                seconds: 5\n", ""}}, wantErr: "no preStop sleep"},
		{name: "preStop exec sleep", edits: []kubeEdit{{dep, "sleep:\n                seconds: 5", `exec: {command: ["sleep", "5"]}`}}, wantErr: "the distroless image has no shell nor sleep"},
		{name: "may run as root", edits: []kubeEdit{{dep, "        runAsNonRoot: true\n", ""}}, wantErr: "runAsNonRoot is not true"},
		{name: "no runAsUser", edits: []kubeEdit{{dep, "        runAsUser: 65532\n", ""}}, wantErr: "no runAsUser"},
		{name: "runAsUser root", edits: []kubeEdit{{dep, "runAsUser: 65532", "runAsUser: 0"}}, wantErr: "runAsUser is 0"},
		{name: "writable root", edits: []kubeEdit{{dep, "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false"}}, wantErr: "readOnlyRootFilesystem is not true"},
		{name: "privilege escalation", edits: []kubeEdit{{dep, "            allowPrivilegeEscalation: false\n", ""}}, wantErr: "allowPrivilegeEscalation is not false"},
		{name: "capabilities kept", edits: []kubeEdit{{dep, "drop: [ALL]", "drop: [NET_RAW]"}}, wantErr: "does not drop ALL"},
		{name: "capability added", edits: []kubeEdit{{dep, "drop: [ALL]", "drop: [ALL]\n              add: [NET_ADMIN]"}}, wantErr: "capabilities.add [NET_ADMIN]"},
		{name: "privileged", edits: []kubeEdit{{dep, "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: true\n            privileged: true"}}, wantErr: `"server": privileged`},
		{name: "seccomp unconfined", edits: []kubeEdit{{dep, "type: RuntimeDefault", "type: Unconfined"}}, wantErr: `seccompProfile.type "Unconfined"; want RuntimeDefault`},
		{name: "container overrides seccomp", edits: []kubeEdit{{dep, "drop: [ALL]", "drop: [ALL]\n            seccompProfile: {type: Unconfined}"}}, wantErr: `seccompProfile.type "Unconfined"`},
		{name: "no memory limit", edits: []kubeEdit{{dep, "limits: {cpu: 2, memory: 256Mi}", "limits: {cpu: 2}"}}, wantErr: "resources.limits.memory is unset"},
		{name: "no requests", edits: []kubeEdit{{dep, "            requests: {cpu: 250m, memory: 256Mi}\n", ""}}, wantErr: "resources.requests.cpu is unset"},
		{name: "request over limit", edits: []kubeEdit{{dep, "cpu: 250m", "cpu: 2500m"}}, wantErr: "resources.requests.cpu 2500m is more than its limit 2"},
		{name: "bad quantity", edits: []kubeEdit{{dep, "memory: 256Mi}\n          securityContext", "memory: 256MB}\n          securityContext"}}, wantErr: `resources.limits.memory: "256MB" is not a quantity`},
		{name: "no spread", edits: []kubeEdit{{dep, "topologyKey: kubernetes.io/hostname", "topologyKey: topology.kubernetes.io/zone"}}, wantErr: "spreads the replicas across nodes"},
		{name: "spread selects nothing", edits: []kubeEdit{{dep, "          labelSelector:\n            matchLabels:\n              app: ipam\n", "          labelSelector:\n            matchLabels:\n              app: ipam-server\n"}},
			wantErr: "topologySpreadConstraints[0] (kubernetes.io/hostname): labelSelector does not select the pods"},
		{name: "anti-affinity selects nothing", edits: []kubeEdit{{dep,
			"      topologySpreadConstraints:\n        - maxSkew: 1\n          topologyKey: kubernetes.io/hostname\n          whenUnsatisfiable: DoNotSchedule\n          labelSelector:\n            matchLabels:\n              app: ipam\n",
			"      affinity:\n        podAntiAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            - topologyKey: kubernetes.io/hostname\n              labelSelector:\n                matchExpressions:\n                  - {key: app, operator: In, values: [other]}\n"}},
			wantErr: "podAntiAffinity term 0 (kubernetes.io/hostname): labelSelector does not select the pods"},
		{name: "not scraped", edits: []kubeEdit{{dep, `        prometheus.io/scrape: "true"` + "\n", ""}}, wantErr: `prometheus.io/scrape is ""`},
		{name: "scrape path", edits: []kubeEdit{{dep, "prometheus.io/path: /metrics", "prometheus.io/path: /metric"}}, wantErr: `prometheus.io/path is "/metric"`},
		{name: "scrape port", edits: []kubeEdit{{dep, `prometheus.io/port: "8443"`, `prometheus.io/port: "9090"`}}, wantErr: `prometheus.io/port is "9090"; want the https port 8443`},
		{name: "scrape scheme missing", edits: []kubeEdit{{dep, "        prometheus.io/scheme: https\n", ""}}, wantErr: `prometheus.io/scheme is ""; want "https"`},
		{name: "scrape over http", edits: []kubeEdit{{dep, "prometheus.io/scheme: https", "prometheus.io/scheme: http"}}, wantErr: `prometheus.io/scheme is "http"; want "https"`},
		{name: "sidecar", edits: []kubeEdit{{dep, "      containers:\n", "      containers:\n        - name: proxy\n          image: envoy:1.30\n"}}, wantErr: "2 containers"},

		// The Service.
		{name: "service selects other pods", edits: []kubeEdit{{svc, "app: ipam", "app: ipam-server"}}, wantErr: "selector map[app:ipam-server] does not select the Deployment's pods"},
		{name: "service without selector", edits: []kubeEdit{{svc, "  selector:\n    app: ipam\n", ""}}, wantErr: "has no selector"},
		{name: "service target port unknown", edits: []kubeEdit{{svc, "targetPort: https", "targetPort: web"}}, wantErr: `port 443 targetPort: "web" names no port`},
		{name: "service target port http", edits: []kubeEdit{{svc, "targetPort: https", "targetPort: http"}}, wantErr: `port 443 targetPort: "http" names no port`},
		{name: "service target port number", edits: []kubeEdit{{svc, "targetPort: https", "targetPort: 8443"}}, wantErr: "port 443 targetPort: 8443 is a number"},
		{name: "service without target port", edits: []kubeEdit{{svc, "      targetPort: https\n", ""}}, wantErr: "port 443 has no targetPort"},
		{name: "service exposed", edits: []kubeEdit{{svc, "spec:\n", "spec:\n  type: LoadBalancer\n"}}, wantErr: "type LoadBalancer; want ClusterIP"},

		// The PodDisruptionBudget.
		{name: "PDB selects other pods", edits: []kubeEdit{{pdb, "app: ipam", "app: ipam-server"}}, wantErr: `PodDisruptionBudget "ipam-server": selector does not select`},
		{name: "PDB selector by expression", edits: []kubeEdit{{pdb, "    matchLabels:\n      app: ipam\n", "    matchExpressions:\n      - {key: tier, operator: NotIn, values: [api]}\n"}},
			wantErr: "selector does not select"},
		{name: "PDB without selector", edits: []kubeEdit{{pdb, "  selector:\n    matchLabels:\n      app: ipam\n", ""}}, wantErr: "has no selector"},
		{name: "PDB blocks every eviction", edits: []kubeEdit{{pdb, "minAvailable: 1", "minAvailable: 2"}}, wantErr: "minAvailable 2 of 2 replicas"},
		{name: "PDB without budget", edits: []kubeEdit{{pdb, "  minAvailable: 1\n", ""}}, wantErr: "neither minAvailable nor maxUnavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := maps.Clone(goodKube)
			for _, e := range tt.edits {
				switch {
				case e.old == "" && e.new == "":
					delete(files, e.file)
				case e.old == "":
					files[e.file] = e.new
				default:
					files[e.file] = edit(t, files[e.file], e.old, e.new)
				}
			}
			_, err := checkKubernetes(files)
			wantError(t, "checkKubernetes", err, tt.wantErr)
		})
	}
}
