// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/azure"
)

// iamPolicy is an AWS IAM policy document.
type iamPolicy struct {
	Version   string
	Statement []struct {
		Sid       string
		Effect    string
		Action    any // a string or a list of them
		Resource  any
		Condition map[string]map[string]string
	}
}

func actionsOf(a any) []string {
	switch v := a.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, x := range v {
			s, _ := x.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}

// TestAWSPolicyGrantsTheCallsMade: the IAM policy allows exactly the EC2
// calls the AWS provider makes (the methods of its EC2 interface), plus
// the CreateTags that tagging an interface at its creation needs, only
// for that creation; interfaces can be detached and deleted only when
// they carry the cluster tag the workers put on theirs (a user's, a
// trunk, an EFA do not): on every network-interface resource, and the
// detach's other resource, the instance, in a statement of its own
// (a tag condition there would test the instance's tags).
func TestAWSPolicyGrantsTheCallsMade(t *testing.T) {
	b, err := os.ReadFile("cloud/aws-iam-policy.json")
	if err != nil {
		t.Fatal(err)
	}
	var p iamPolicy
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.Version != "2012-10-17" {
		t.Fatalf("version %q", p.Version)
	}
	want := []string{"ec2:CreateTags"}
	api := reflect.TypeFor[aws.EC2]()
	for i := range api.NumMethod() {
		want = append(want, "ec2:"+api.Method(i).Name)
	}
	slices.Sort(want)
	var got []string
	limited := map[string]bool{}
	for _, st := range p.Statement {
		if st.Effect != "Allow" {
			t.Errorf("statement %s: effect %q", st.Sid, st.Effect)
		}
		acts := actionsOf(st.Action)
		got = append(got, acts...)
		for _, a := range acts {
			switch a {
			case "ec2:CreateTags":
				if st.Condition["StringEquals"]["ec2:CreateAction"] != "CreateNetworkInterface" {
					t.Errorf("CreateTags not limited to CreateNetworkInterface: %v", st.Condition)
				}
			case "ec2:DeleteNetworkInterface", "ec2:DetachNetworkInterface":
				for _, r := range resourcesOf(st.Resource) {
					tagged := st.Condition["Null"]["aws:ResourceTag/"+cloud.TagCluster] == "false"
					switch {
					case r == "arn:aws:ec2:*:*:network-interface/*" && tagged:
						limited[a] = true
					case a == "ec2:DetachNetworkInterface" && r == "arn:aws:ec2:*:*:instance/*" && len(st.Condition) == 0:
					default:
						t.Errorf("statement %s: %s on %s with %v, not only on interfaces tagged %s", st.Sid, a, r, st.Condition, cloud.TagCluster)
					}
				}
			}
		}
	}
	for _, a := range []string{"ec2:DeleteNetworkInterface", "ec2:DetachNetworkInterface"} {
		if !limited[a] {
			t.Errorf("%s not granted on interfaces tagged %s", a, cloud.TagCluster)
		}
	}
	got = slices.Compact(slices.Sorted(slices.Values(got)))
	if !slices.Equal(got, want) {
		t.Fatalf("policy actions\n %v\nwant\n %v", got, want)
	}
}

// resourcesOf is a statement's Resource, a string or a list of them.
func resourcesOf(r any) []string { return actionsOf(r) }

// TestAzureRoleGrantsTheCallsMade: the custom role grants the actions the
// Azure provider documents its calls need, no more, on a resource group.
func TestAzureRoleGrantsTheCallsMade(t *testing.T) {
	b, err := os.ReadFile("cloud/azure-role.json")
	if err != nil {
		t.Fatal(err)
	}
	var role struct {
		Name             string
		IsCustom         bool
		Actions          []string
		NotActions       []string
		AssignableScopes []string
	}
	if err := json.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values(azure.RequiredActions))
	got := slices.Sorted(slices.Values(role.Actions))
	if !role.IsCustom || role.Name == "" || !slices.Equal(got, want) {
		t.Fatalf("role %+v\nwant actions %v", role, want)
	}
	if len(role.AssignableScopes) != 1 || role.AssignableScopes[0] != "/subscriptions/SUBSCRIPTION_ID/resourceGroups/NODE_RESOURCE_GROUP" {
		t.Fatalf("scopes %v: the nodes' resource group only", role.AssignableScopes)
	}
}
