#!/usr/bin/env bash
# Builds the Kubernetes programs gpuctl's Kubernetes tests run as real
# processes (kube-apiserver, kube-controller-manager, kubelet) from the
# k8s.io/kubernetes module, into bin/kube/. The module's go.mod points its
# staging modules (k8s.io/api, client-go, …) at directories its published
# zip leaves out, so the build uses a copy whose go.mod asks for their
# published releases instead. A build of the same release is kept.
#
# The release: kubelets after 1.34 refuse cgroup v1 by default and the
# 1.36 ones containerd 1.x, which is what Debian ships.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${KUBE_VERSION:-v1.34.4}
staging=v0${version#v1}   # k8s.io/kubernetes v1.34.4 ↔ k8s.io/api v0.34.4
out=$PWD/bin/kube
if [ -f "$out/VERSION" ] && [ "$(cat "$out/VERSION")" = "$version" ] &&
	[ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ] && [ -x "$out/kubelet" ]; then
	exit 0
fi

work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
echo "kube-build: k8s.io/kubernetes $version (staging modules $staging) into $out"
dir=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
if [ -z "$dir" ]; then
	echo "kube-build: could not download k8s.io/kubernetes@$version through the module proxy" >&2
	exit 1
fi
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
cd "$work/src"
rm -f go.work go.work.sum
# Drop the replace block and ask for each staging module's release.
awk -v v="$staging" '
	/^replace \($/ { skip = 1; next }
	skip && /^\)$/ { skip = 0; next }
	skip { next }
	{ print }
' go.mod > go.mod.new
mv go.mod.new go.mod
sed -i -E "s#^(\s+k8s\.io/[a-z-]+) v0\.0\.0\$#\1 $staging#" go.mod
if grep -qE '^\s+k8s\.io/[a-z-]+ v0\.0\.0$' go.mod; then
	echo "kube-build: staging modules left at v0.0.0 in go.mod:" >&2
	grep -E '^\s+k8s\.io/[a-z-]+ v0\.0\.0$' go.mod >&2
	exit 1
fi
mkdir -p "$out"
GOFLAGS=-mod=mod GOWORK=off go build -trimpath -ldflags=-s -o "$out/" \
	./cmd/kube-apiserver ./cmd/kube-controller-manager ./cmd/kubelet
echo "$version" > "$out/VERSION"
echo "kube-build: built $(ls "$out" | grep -v VERSION | tr '\n' ' ')"
