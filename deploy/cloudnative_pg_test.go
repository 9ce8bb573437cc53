// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

const cnpgDir = "cloudnative-pg"

// cnpgCluster is the part of CloudNativePG's Cluster (postgresql.cnpg.io/v1)
// that deploy/cloudnative-pg uses, after its documentation: the Go module
// with the real type and CRD is not served here. A strict decode into it
// catches a misspelt field of this example, not one the CRD would refuse.
type cnpgCluster struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Instances             int    `json:"instances"`
		ImageName             string `json:"imageName"`
		PrimaryUpdateStrategy string `json:"primaryUpdateStrategy"`
		PrimaryUpdateMethod   string `json:"primaryUpdateMethod"`
		PostgreSQL            struct {
			Synchronous *struct {
				Method         string `json:"method"`
				Number         int    `json:"number"`
				DataDurability string `json:"dataDurability"`
			} `json:"synchronous"`
			Parameters map[string]string `json:"parameters"`
		} `json:"postgresql"`
		Bootstrap struct {
			InitDB struct {
				Database               string   `json:"database"`
				Owner                  string   `json:"owner"`
				PostInitApplicationSQL []string `json:"postInitApplicationSQL"`
			} `json:"initdb"`
		} `json:"bootstrap"`
		Storage struct {
			Size string `json:"size"`
		} `json:"storage"`
		Affinity struct {
			EnablePodAntiAffinity bool   `json:"enablePodAntiAffinity"`
			TopologyKey           string `json:"topologyKey"`
			PodAntiAffinityType   string `json:"podAntiAffinityType"`
		} `json:"affinity"`
	} `json:"spec"`
}

// checkCNPGCluster checks the durability the service's HA relies on.
func checkCNPGCluster(src string) (cnpgCluster, error) {
	var c cnpgCluster
	if err := sigsyaml.UnmarshalStrict([]byte(src), &c); err != nil {
		return c, fmt.Errorf("cluster.yaml: %w", err)
	}
	var errs []string
	add := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	if c.APIVersion != "postgresql.cnpg.io/v1" || c.Kind != "Cluster" {
		add("not a postgresql.cnpg.io/v1 Cluster: %s %s", c.APIVersion, c.Kind)
	}
	if c.Metadata.Namespace != "ipam" {
		add("namespace %q, want the server's ipam", c.Metadata.Namespace)
	}
	if c.Spec.Instances != 3 {
		add("%d instances, want 3 (a primary and two standbys)", c.Spec.Instances)
	}
	s := c.Spec.PostgreSQL.Synchronous
	switch {
	case s == nil:
		add("no spec.postgresql.synchronous: commits would not wait for a standby")
	default:
		if s.Method != "any" && s.Method != "first" {
			add("synchronous.method %q, want any or first", s.Method)
		}
		if s.Number != 1 {
			add("synchronous.number %d, want 1", s.Number)
		}
		if s.DataDurability != "required" {
			add("synchronous.dataDurability %q, want required (a write waits for a standby rather than go on on one machine)", s.DataDurability)
		}
	}
	if v, ok := c.Spec.PostgreSQL.Parameters["synchronous_commit"]; ok && v != "on" && v != "remote_apply" {
		add("synchronous_commit %q: a commit would not wait for the standby's flush", v)
	}
	if !strings.HasPrefix(c.Spec.ImageName, "ghcr.io/cloudnative-pg/postgresql:15") {
		add("imageName %q: the service is tested with PostgreSQL 15", c.Spec.ImageName)
	}
	in := c.Spec.Bootstrap.InitDB
	if in.Database == "" || in.Owner == "" {
		add("bootstrap.initdb names no database and owner")
	}
	if !slices.Contains(in.PostInitApplicationSQL, "GRANT pg_monitor TO "+in.Owner) {
		add("bootstrap.initdb.postInitApplicationSQL does not GRANT pg_monitor TO %s: the service could not see its standbys", in.Owner)
	}
	if c.Spec.PrimaryUpdateMethod != "switchover" {
		add("primaryUpdateMethod %q, want switchover", c.Spec.PrimaryUpdateMethod)
	}
	if !c.Spec.Affinity.EnablePodAntiAffinity || c.Spec.Affinity.PodAntiAffinityType != "required" {
		add("instances may share a node")
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("cluster.yaml: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// cnpgKustomization is the part of kustomization.yaml this example uses.
type cnpgKustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Patches    []struct {
		Target struct {
			Group, Version, Kind, Name string
		} `json:"target"`
		Patch string `json:"patch"`
	} `json:"patches"`
}

// renderCNPG applies the kustomization's patch to the base Deployment, as
// kustomize would (a JSON 6902 patch), and answers the patched
// Deployment's YAML.
func renderCNPG(kust, baseDeployment string) (string, error) {
	var k cnpgKustomization
	if err := sigsyaml.UnmarshalStrict([]byte(kust), &k); err != nil {
		return "", fmt.Errorf("kustomization.yaml: %w", err)
	}
	if !slices.Contains(k.Resources, "../kubernetes") || !slices.Contains(k.Resources, "cluster.yaml") {
		return "", fmt.Errorf("kustomization.yaml: resources %v, want ../kubernetes and cluster.yaml", k.Resources)
	}
	if len(k.Patches) != 1 || k.Patches[0].Target.Kind != "Deployment" || k.Patches[0].Target.Name != "ipam-server" {
		return "", fmt.Errorf("kustomization.yaml: want one patch of Deployment ipam-server")
	}
	ops, err := sigsyaml.YAMLToJSON([]byte(k.Patches[0].Patch))
	if err != nil {
		return "", fmt.Errorf("the patch: %w", err)
	}
	patch, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		return "", fmt.Errorf("the patch: %w", err)
	}
	doc, err := sigsyaml.YAMLToJSON([]byte(baseDeployment))
	if err != nil {
		return "", err
	}
	out, err := patch.Apply(doc)
	if err != nil {
		return "", fmt.Errorf("the patch does not apply to deploy/kubernetes/deployment.yaml: %w", err)
	}
	y, err := sigsyaml.JSONToYAML(out)
	return string(y), err
}

// checkCNPGServer checks the patched Deployment against the Cluster: the
// URL reaches the primary's Service as the database's owner with the
// password of CloudNativePG's app Secret, declared before the URL that
// uses it, with TLS verified against the Cluster's CA.
func checkCNPGServer(rendered string, c cnpgCluster) error {
	var d appsv1.Deployment
	if err := sigsyaml.UnmarshalStrict([]byte(rendered), &d); err != nil {
		return err
	}
	ctr := d.Spec.Template.Spec.Containers[0]
	env := map[string]int{}
	for i, e := range ctr.Env {
		env[e.Name] = i
	}
	pw, ok := env["DB_PASSWORD"]
	u, ok2 := env["IPAM_DATABASE_URL"]
	if !ok || !ok2 || pw > u {
		return fmt.Errorf("want DB_PASSWORD declared before IPAM_DATABASE_URL (kubelet expands $(VAR) only from earlier entries): %v", env)
	}
	if ref := ctr.Env[pw].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != c.Metadata.Name+"-app" || ref.SecretKeyRef.Key != "password" {
		return fmt.Errorf("DB_PASSWORD is not the password of Secret %s-app", c.Metadata.Name)
	}
	raw := ctr.Env[u].Value
	parsed, err := url.Parse(strings.ReplaceAll(raw, "$(DB_PASSWORD)", "pw"))
	if err != nil {
		return fmt.Errorf("IPAM_DATABASE_URL %q: %w", raw, err)
	}
	wantHost := fmt.Sprintf("%s-rw.%s.svc:5432", c.Metadata.Name, c.Metadata.Namespace)
	user := c.Spec.Bootstrap.InitDB.Owner
	if parsed.Host != wantHost || parsed.User.Username() != user || !strings.Contains(raw, ":$(DB_PASSWORD)@") ||
		parsed.Path != "/"+c.Spec.Bootstrap.InitDB.Database {
		return fmt.Errorf("IPAM_DATABASE_URL %q: want %s@%s/%s with $(DB_PASSWORD)", raw, user, wantHost, c.Spec.Bootstrap.InitDB.Database)
	}
	q := parsed.Query()
	if q.Get("sslmode") != "verify-full" || q.Get("connect_timeout") == "" {
		return fmt.Errorf("IPAM_DATABASE_URL %q: want sslmode=verify-full and a connect_timeout", raw)
	}
	root := q.Get("sslrootcert")
	var mount *corev1.VolumeMount
	for i, m := range ctr.VolumeMounts {
		if strings.HasPrefix(root, m.MountPath+"/") {
			mount = &ctr.VolumeMounts[i]
		}
	}
	if mount == nil {
		return fmt.Errorf("sslrootcert %s is in no mounted volume", root)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == mount.Name {
			if v.Secret == nil || v.Secret.SecretName != c.Metadata.Name+"-ca" ||
				!slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Key == "ca.crt" && mount.MountPath+"/"+k.Path == root }) {
				return fmt.Errorf("sslrootcert %s is not ca.crt of Secret %s-ca", root, c.Metadata.Name)
			}
			return nil
		}
	}
	return fmt.Errorf("volume %s is not declared", mount.Name)
}

// The CloudNativePG example: its Cluster keeps a synchronous standby, and
// the server's Deployment, patched as its kustomization says, reaches the
// primary through the -rw Service and is valid for the Kubernetes schemas.
func TestCloudNativePG(t *testing.T) {
	root := filepath.Join(repoRoot(t), "deploy")
	files := readKubeDir(t, filepath.Join(root, cnpgDir))
	c, err := checkCNPGCluster(files["cluster.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := renderCNPG(files["kustomization.yaml"], readFile(t, filepath.Join(root, kubeDir, "deployment.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkCNPGServer(rendered, c); err != nil {
		t.Error(err)
	}
	if err := kubeconform(t, openAPIDefinitions(t), map[string]string{cnpgDir + "/deployment (patched)": rendered}); err != nil {
		t.Errorf("kubeconform:\n%v", err)
	}
	if _, ok := files["README.md"]; !ok {
		t.Error("deploy/cloudnative-pg has no README.md")
	}
}

// Each check of the example can fail.
func TestCloudNativePGChecksFindProblems(t *testing.T) {
	root := filepath.Join(repoRoot(t), "deploy")
	files := readKubeDir(t, filepath.Join(root, cnpgDir))
	base := readFile(t, filepath.Join(root, kubeDir, "deployment.yaml"))
	for _, tc := range []struct{ name, file, old, new, want string }{
		{"two instances", "cluster.yaml", "instances: 3", "instances: 2", "2 instances"},
		{"no synchronous standby", "cluster.yaml", "      number: 1\n", "      number: 0\n", "synchronous.number 0"},
		{"availability over durability", "cluster.yaml", "dataDurability: required", "dataDurability: preferred", "dataDurability"},
		{"asynchronous commit", "cluster.yaml", `synchronous_commit: "on"`, `synchronous_commit: "local"`, "synchronous_commit"},
		{"misspelt field", "cluster.yaml", "instances: 3", "instance: 3", "unknown field"},
		{"no pg_monitor", "cluster.yaml", "GRANT pg_monitor TO ipam", "SELECT 1", "pg_monitor"},
		{"the read-only Service", "kustomization.yaml", "ipam-db-rw.ipam.svc", "ipam-db-ro.ipam.svc", "ipam-db-rw"},
		{"no TLS verification", "kustomization.yaml", "sslmode=verify-full", "sslmode=require", "verify-full"},
		{"another Secret", "kustomization.yaml", "name: ipam-db-app", "name: ipam-db-superuser", "Secret ipam-db-app"},
		{"password after the URL", "kustomization.yaml", "path: /spec/template/spec/containers/0/env/1", "path: /spec/template/spec/containers/0/env/0", "before IPAM_DATABASE_URL"},
		{"the patch misses", "kustomization.yaml", "/containers/0/env/0", "/containers/0/envs/0", "does not apply"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edited := map[string]string{"cluster.yaml": files["cluster.yaml"], "kustomization.yaml": files["kustomization.yaml"]}
			if !strings.Contains(edited[tc.file], tc.old) {
				t.Fatalf("%s does not hold %q", tc.file, tc.old)
			}
			edited[tc.file] = strings.Replace(edited[tc.file], tc.old, tc.new, 1)
			c, err := checkCNPGCluster(edited["cluster.yaml"])
			if err == nil {
				var rendered string
				if rendered, err = renderCNPG(edited["kustomization.yaml"], base); err == nil {
					err = checkCNPGServer(rendered, c)
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one that says %q", err, tc.want)
			}
		})
	}
}
