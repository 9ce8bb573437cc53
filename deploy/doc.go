// Package deploy holds no code: its tests check the repository's container
// build (Dockerfile, .dockerignore) and docker-compose.yaml statically,
// since no container engine runs where the tests do.
package deploy
