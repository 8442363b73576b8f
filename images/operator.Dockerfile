# syntax=docker/dockerfile:1
# rocshare operator: Kopf reconcilers, the scheduler extender (:31990, pod loopback; metrics
# :31993) and the pod admission webhook (:9443). Build from the project root:
#   docker build -f images/operator.Dockerfile -t rocshare/operator:0.1.0 .
# images/operator.Dockerfile.dockerignore keeps the build context to the sources.

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

# ---- run: the venv on a clean slim base, unprivileged -------------------------------------
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="rocshare-operator" \
      org.opencontainers.image.description="rocshare operator: shares AMD GPUs between Kubernetes pods" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/rocshare/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/rocshare /opt/rocshare
# No privilege needed: it talks to the API server and listens on ports above 1024. A numeric
# user, so that runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 31990 31993 9443
ENTRYPOINT ["rocshare"]
CMD ["operator", "--namespace", "rocshare-system"]
