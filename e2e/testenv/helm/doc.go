// Package helm only pins the Helm module whose CLI scripts/k8s-testenv.sh builds.
package helm
