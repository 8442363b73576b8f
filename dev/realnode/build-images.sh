#!/usr/bin/env bash
# `make images`: every image the real-node rig runs, built here without any registry.
#   localhost/rocshare/base:trixie        mmdebstrap minbase trixie (Debian 13) + python3 (3.13), python3-venv
#   localhost/rocshare/pause:dev          controlplane/cmd/pause (static), from scratch
#   localhost/rocshare/operator:dev       images/operator.Dockerfile on the local base
#   localhost/rocshare/node-agent:dev     images/agent.Dockerfile on the local base
#   localhost/rocshare/kube-scheduler:v<K8S_VERSION>   the control plane's own kube-scheduler binary
#   localhost/rocshare/workload:dev       the local base + the hook's stub ROCm runtime and hook-probe
#                                         (make -C hook install-probe), for the tests' slice pods
#   localhost/rocshare/workload:bullseye  the same probe on Debian 11 (glibc 2.31) and 12 (2.36), each
#   localhost/rocshare/workload:bookworm  compiled inside its own suite: the hook's glibc floor, proven
# Each ends as a docker-archive in .cache/images/<name>.tar (what the rig imports into
# containerd), cached by a content stamp: a second run with unchanged inputs does nothing.
# buildah keeps its storage under .cache/containers, so the base image is cached there too.
# Needs: dev/realnode/install-deps.sh and controlplane/build.sh done first.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
cache=.cache/images
# The control plane version (make ... K8S_VERSION=1.37.2; default controlplane/k8s/default-version).
k8s_version=${K8S_VERSION:-$(cat controlplane/k8s/default-version)}
k8s_version=${k8s_version#v}
bin=${ROCSHARE_BIN_DIR:-$root/.cache/k8s/$k8s_version/bin}
mkdir -p "$cache"
buildah() { command buildah --root "$root/.cache/containers/storage" --runroot "$root/.cache/containers/run" --storage-driver overlay "$@"; }

# stamp <files...>: a short hash of the files' contents and names.
stamp() { (for f in "$@"; do echo "$f"; cat "$f"; done) | sha256sum | cut -c1-16; }
sources_stamp() { stamp "$@" $(find src operator nodeagent -type f \( -name '*.py' -o -name '*.j2' -o -name '*.proto' -o -name '*.yaml' -o -name '*.lua' -o -name '*.typed' \) -not -path '*/__pycache__/*' | sort); }
hook_files() { find hook -type f -not -path 'hook/build/*' | sort; }  # the memory hook's sources (C, Makefile)
fresh() { [ -f "$cache/$1.tar" ] && [ "$(cat "$cache/$1.stamp" 2>/dev/null)" = "$2" ]; }
save() {  # save <image> <archive name> <stamp>
  rm -f "$cache/$2.tar"
  buildah push --quiet "$1" "docker-archive:$cache/$2.tar:$1" >/dev/null
  echo "$3" > "$cache/$2.stamp"
  echo "images: $2 built ($1)"
}

# ---- base: a trixie rootfs with Debian's python3 (3.13) -------------------------------------
# The public images' base is python:3.13-slim-trixie (images/*.Dockerfile); this one matches it:
# the same Debian release (so libdrm's amdgpu.ids is trixie's) and the same Python minor.
suite=trixie
base=localhost/rocshare/base:$suite
base_stamp=$(echo "minbase $suite python3 python3-venv ca-certificates v1" | sha256sum | cut -c1-16)
if ! fresh base "$base_stamp"; then
  start=$(date +%s)
  if [ "$(cat "$cache/$suite-rootfs.stamp" 2>/dev/null)" != "$base_stamp" ]; then
    # --format=tar: the output is a tarball whatever its name (a directory target would hold
    # mmdebstrap's /proc and /sys mounts while it runs).
    mmdebstrap --quiet --variant=minbase --format=tar --include=python3,python3-venv,ca-certificates \
      $suite "$cache/$suite-rootfs.tar.part"
    mv "$cache/$suite-rootfs.tar.part" "$cache/$suite-rootfs.tar"
    echo "$base_stamp" > "$cache/$suite-rootfs.stamp"
  fi
  c=$(buildah from scratch)
  buildah add --quiet "$c" "$cache/$suite-rootfs.tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd /bin/bash "$c"
  buildah commit --quiet --rm "$c" "$base" >/dev/null
  save "$base" base "$base_stamp"
  echo "images: base in $(( $(date +%s) - start )) s"
fi

# ---- pause: the sandbox image containerd's CRI uses --------------------------------------
pause_stamp=$(stamp "$bin/pause")
if ! fresh pause "$pause_stamp"; then
  c=$(buildah from scratch)
  buildah copy --quiet "$c" "$bin/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit --quiet --rm "$c" localhost/rocshare/pause:dev >/dev/null
  save localhost/rocshare/pause:dev pause "$pause_stamp"
fi

# ---- kube-scheduler: the control plane's own binary on the local base ---------------------
sched_stamp=$(stamp "$bin/kube-scheduler" "$cache/base.stamp")
if ! fresh kube-scheduler "$sched_stamp"; then
  c=$(buildah from "$base")
  buildah copy --quiet --chmod 0755 "$c" "$bin/kube-scheduler" /usr/local/bin/kube-scheduler >/dev/null
  buildah config --cmd '[]' "$c"  # the base's /bin/bash, cleared first, or it becomes an argument
  buildah config --entrypoint '["/usr/local/bin/kube-scheduler"]' --user 65532:65532 "$c"
  buildah commit --quiet --rm "$c" localhost/rocshare/kube-scheduler:v$k8s_version >/dev/null
  save localhost/rocshare/kube-scheduler:v$k8s_version kube-scheduler "$sched_stamp"
fi

# ---- workload: what the tests' slice pods run -------------------------------------------
# The base plus the hook's stub ROCm runtime and hook-probe under /opt/rocm-stub, built here by
# the hook's own Makefile (`make -C hook install-probe`): a slice pod runs hook-probe on the
# stub runtime with the hook rocshare installed on the node (tests/realnode/test_hook_enforces.py).
workload_stamp=$(stamp "$cache/base.stamp" $(hook_files))
if ! fresh workload "$workload_stamp"; then
  probe_root="$root/$cache/workload-root"
  rm -rf "$probe_root"
  make --no-print-directory -C hook install-probe DESTDIR="$probe_root" >/dev/null
  c=$(buildah from "$base")
  buildah copy --quiet "$c" "$probe_root" / >/dev/null
  buildah commit --quiet --rm "$c" localhost/rocshare/workload:dev >/dev/null
  save localhost/rocshare/workload:dev workload "$workload_stamp"
fi

# ---- workload-<suite>: the same probe in images of older glibc generations ----------------
# The hook must load under every glibc from hook/GLIBC_FLOOR on, so the real-node tests run the
# probe in Debian bullseye (glibc 2.31) and bookworm (2.36) too, beside trixie's (2.41) above.
# A binary linked against a newer glibc does not start under an older one (this machine's imports
# __libc_start_main@GLIBC_2.34), so each suite's stub runtime and probe are compiled INSIDE a
# rootfs of that suite (its own gcc and libc6-dev, the Makefile's install-probe), and the
# compiler is purged before the rootfs becomes the image. No python: the probe needs none.
rocm_include=
for suite in bullseye bookworm; do
  name=workload-$suite
  suite_stamp=$( (echo "minbase $suite gcc make libc6-dev purge v1"; stamp $(hook_files)) | sha256sum | cut -c1-16)
  fresh "$name" "$suite_stamp" && continue
  start=$(date +%s)
  rocm_include=${rocm_include:-$(hook/deps.sh)}
  rm -f "$cache/$name-rootfs.tar"
  mmdebstrap --quiet --variant=minbase --format=tar --include=gcc,make,libc6-dev \
    --customize-hook="mkdir -p \"\$1/src/rocm\" && tar -C '$root' --exclude=hook/build -c hook | tar -x -C \"\$1/src\" && cp -a '$rocm_include/.' \"\$1/src/rocm/\"" \
    --customize-hook='chroot "$1" make -s -C /src/hook install-probe BUILD=/tmp/probe-build DESTDIR=/ ROCM_INCLUDE=/src/rocm' \
    --customize-hook='rm -rf "$1/src" "$1/tmp/probe-build"' \
    --customize-hook='chroot "$1" apt-get purge -y -qq --autoremove gcc make libc6-dev >/dev/null' \
    "$suite" "$cache/$name-rootfs.tar"
  c=$(buildah from scratch)
  buildah add --quiet "$c" "$cache/$name-rootfs.tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd /bin/bash "$c"
  buildah commit --quiet --rm "$c" "localhost/rocshare/workload:$suite" >/dev/null
  rm -f "$cache/$name-rootfs.tar"
  save "localhost/rocshare/workload:$suite" "$name" "$suite_stamp"
  echo "images: $name in $(( $(date +%s) - start )) s"
done

# ---- operator and agent: the project's Dockerfiles, on the local base ---------------------
# A machine whose HTTPS goes through an intercepting proxy trusts its CA through PIP_CERT (or
# SSL_CERT_FILE); pip in the build container then needs that bundle too. It is mounted for the
# RUN steps only (with a pip.conf naming it), never written into an image.
ca_bundle=${PIP_CERT:-${SSL_CERT_FILE:-}}
build_mounts=()
if [ -n "$ca_bundle" ] && [ -f "$ca_bundle" ]; then
  printf '[global]\ncert = /etc/ssl/certs/build-host-ca.crt\n' > "$cache/pip.conf"
  build_mounts=(-v "$ca_bundle:/etc/ssl/certs/build-host-ca.crt:ro" -v "$root/$cache/pip.conf:/etc/pip.conf:ro")
fi
for app in operator agent; do
  name=$([ "$app" = agent ] && echo node-agent || echo operator)
  hook_sources=$([ "$app" = agent ] && hook_files || true)  # the agent image builds the hook
  app_stamp=$(sources_stamp "images/$app.Dockerfile" "images/$app.Dockerfile.dockerignore" pyproject.toml constraints.txt "$cache/base.stamp" $hook_sources)
  fresh "$name" "$app_stamp" && continue
  start=$(date +%s)
  # chroot isolation and the host network: RUN steps need PyPI, and no CNI is set up for buildah.
  buildah bud --quiet --layers --isolation chroot --network host "${build_mounts[@]}" \
    --build-arg "BASE_IMAGE=$base" -f "images/$app.Dockerfile" --ignorefile "images/$app.Dockerfile.dockerignore" \
    -t "localhost/rocshare/$name:dev" . >/dev/null
  save "localhost/rocshare/$name:dev" "$name" "$app_stamp"
  echo "images: $name in $(( $(date +%s) - start )) s"
done
echo "images: all in $cache"
