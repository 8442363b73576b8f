# syntax=docker/dockerfile:1
# rocshare node agent: GPU discovery from sysfs, health, AmdGpuNode publishing, the kubelet
# device plugin for amd.com/gpu, the dmem VRAM cap, the monitor on :9394, and rocshare's memory
# hook (/opt/rocshare/hook/librocshare-hook.so), which it installs on its node. Build from the
# project root:
#   docker build -f images/agent.Dockerfile -t rocshare/node-agent:0.1.0 .
# images/agent.Dockerfile.dockerignore keeps the build context to the sources.

# The base is a build argument: the public Python image on Debian 13 (trixie) by default; the
# tests pass one made here (`make images`: Debian trixie with its python3, 3.13), since no
# registry is reachable. Both are trixie with Python 3.13 and have `python3`, so the steps below
# name it so.
ARG BASE_IMAGE=python:3.13-slim-trixie

# ---- build: the package and its pinned dependencies in a venv -----------------------------
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/rocshare
WORKDIR /src
# Dependencies first (direct pins from pyproject.toml, the rest from constraints.txt), so that
# a source change reuses this layer. grpcio, pydantic-core and aiohttp ship manylinux
# wheels, so the slim base needs no compiler.
COPY pyproject.toml constraints.txt ./
RUN python3 -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && /opt/rocshare/bin/pip install -c constraints.txt -r requirements.txt
COPY src ./src
COPY operator ./operator
COPY nodeagent ./nodeagent
RUN /opt/rocshare/bin/pip install --no-deps . \
 && /opt/rocshare/bin/python -m compileall -q /opt/rocshare/lib

# ---- hook: rocshare's in-container memory hook (hook/, C), built by its own Makefile ---------
# A compiler only in this stage; the run stage gets the one library (docs/memory-hook.md).
FROM ${BASE_IMAGE} AS hook
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc make libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY hook ./hook
# Only the library (not the stub runtime or the tests). hook/deps.sh fetches the ROCm headers it
# compiles against; ROCSHARE_HOOK_REAL_RUNTIME=0: the real HIP runtime is for the tests, not the build.
# This stage's glibc is trixie's (2.41), yet the library must load in older images: the Makefile
# fails the build if it needs any glibc symbol version above hook/GLIBC_FLOOR (readelf, from
# the binutils gcc brings; docs/memory-hook.md).
RUN ROCSHARE_HOOK_REAL_RUNTIME=0 make -C hook build/librocshare-hook.so \
 && install -D -m 0644 hook/build/librocshare-hook.so /opt/rocshare/hook/librocshare-hook.so
# The load check (a static program: it runs from the host's view, before the container's root is
# its root), installed by the agent beside the hook and named by CDI (rocshare_agent/load_check.py).
RUN make -C hook build/rocshare-loadcheck \
 && install -D -m 0755 hook/build/rocshare-loadcheck /opt/rocshare/hook/rocshare-loadcheck

# ---- run -----------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="rocshare-node-agent" \
      org.opencontainers.image.description="rocshare node agent: AMD GPU discovery, device plugin, monitor" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/rocshare/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# libdrm's amdgpu.ids (/usr/share/libdrm/amdgpu.ids): the marketing names of Radeon boards,
# whose DRM folder leaves product_name empty (discovery/names.py; without it the built-in table
# and "AMD GPU <id>" are all the agent has).
# apt-get clean: the local trixie base keeps apt's caches (the public slim image cleans by itself).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libdrm-common \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/rocshare /opt/rocshare
# The hook the agent installs into the pool's hookPath on its node (rocshare_agent/hook_install.py).
COPY --from=hook /opt/rocshare/hook /opt/rocshare/hook
# The agent runs as root (the DaemonSet also makes it privileged, with hostPID), because its
# job is the host's devices, not its own container:
#  * the kubelet's device-plugin folder (/var/lib/kubelet/device-plugins) is root-owned 0750;
#    the agent creates its socket there and connects to kubelet.sock;
#  * health checks open /dev/kfd and /dev/dri/card*, renderD* of every GPU (root or the
#    render/video groups, whose ids differ per host);
#  * the dmem VRAM cap writes dmem.max in each pod's cgroup under /sys/fs/cgroup;
#  * the memory hook is installed into the pool's hookPath (root-owned, e.g. /usr/local/vgpu);
#  * the monitor reads /sys/class/kfd/kfd/proc/<pid>/vram_* and /proc/<pid>/cgroup of other
#    users' processes (hostPID), which needs CAP_SYS_PTRACE-level access.
# A non-root user with the right groups and capabilities would differ per host and still need
# most of these; the pod's privilege is what matters, and it is scoped to GPU nodes.
USER 0:0
EXPOSE 9394
ENTRYPOINT ["rocshare"]
CMD ["agent"]
