// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package deploy holds no code: its tests check the repository's container
// build (Dockerfile, read by BuildKit's parser, and .dockerignore),
// docker-compose.yaml (loaded by the Compose specification's compose-go)
// and the Kubernetes manifests under kubernetes/ and cni/ statically, since
// no container engine nor cluster runs where the tests do; kubeconform validates every manifest
// against the Kubernetes JSON schemas. The RBAC of kube-access/ is applied to a
// real kube-apiserver (internal/kubetest) and checked as the server's
// service account. The cloud permissions of cloud/ are checked against the
// calls the cloud providers make.
//
// The Helm chart helm/ipam is linted and rendered by a real helm (built by
// scripts/ensure-helm.sh), with the defaults and each value set of its ci/:
// every set passes the static checks above and a server-side dry run on a
// real kube-apiserver; kubernetes/ and cni/ are its rendered output (make
// manifests), and its RBAC, alerts and dashboard are those of kube-access/
// and observability/.
//
// docs_test.go keeps the tables of docs/ to short cells.
package deploy
