// Package deploy holds no code: its tests check the repository's container
// build (Dockerfile, .dockerignore), docker-compose.yaml and the Kubernetes
// manifests under kubernetes/ and cni/ statically, since no container engine nor
// cluster runs where the tests do.
package deploy
