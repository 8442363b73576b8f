"""Argo CD for the e2e tests, as a user runs it beside a cluster: its application controller and
repo server (one binary, built from Argo CD's Go module by dev/argocd/build.sh), a Redis from
Debian's package, and a Git server on loopback (`git daemon`) serving a commit of this working
tree's deployable folders. Argo CD reads only Git and the API server; nothing here writes the
objects it syncs.

Invariants: every process started here is stopped by `stop()` (each in its own session); the
Git repository is a temporary one, so tests may commit to it (to remove a sample) freely.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, ControlPlane, free_port, stop_process

NAMESPACE = "argocd"
REPO_NAME = "rocshare"
SERVED_FOLDERS = ("crds", "samples", "manifests", "charts")
"""What the Git server carries: the folders an Application of the project points at."""
PART_OF_ARGOCD = {"app.kubernetes.io/part-of": "argocd"}
"""Argo CD's settings informer selects its ConfigMaps and Secret by this label."""


def build_argocd() -> Path:
    """The folder with argocd-application-controller and argocd-repo-server (built when stale)."""
    result = subprocess.run([str(PROJECT_ROOT / "dev" / "argocd" / "build.sh")], capture_output=True, text=True,
                            check=True, timeout=3600)
    return Path(result.stdout.strip().splitlines()[-1])


def build_helm() -> Path:
    result = subprocess.run([str(PROJECT_ROOT / "dev" / "helm" / "build.sh")], capture_output=True, text=True,
                            check=True, timeout=3600)
    return Path(result.stdout.strip().splitlines()[-1])


def shipped_application(repo_url: str, *, name: str, source: dict[str, Any]) -> dict[str, Any]:
    """manifests/argocd/application.yaml as a user adapts it: their Git server, their path."""
    app = yaml.safe_load((PROJECT_ROOT / "manifests" / "argocd" / "application.yaml").read_text())
    app["metadata"]["name"] = name
    app["spec"]["source"] = {**source, "repoURL": repo_url, "targetRevision": "main"}
    return app


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "e2e", "GIT_AUTHOR_EMAIL": "e2e@localhost",
           "GIT_COMMITTER_NAME": "e2e", "GIT_COMMITTER_EMAIL": "e2e@localhost"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


@dataclass
class ApplicationRecord:
    """Every version of one Application that the API server's watch delivers, in order, kept in a
    file by `kubectl get --watch`. A watch sends each write, so an operation's intermediate states
    (one per sync wave) and an operation that a later one replaced are all in here; `versions()`
    fails when the watch ended early, since then a state may be missing."""

    cluster: ControlPlane
    name: str
    path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # A field selector, not a name: a named get fails while the Application does not exist yet.
        command = [str(self.cluster.bin_dir / "kubectl"), f"--kubeconfig={self.cluster.kubeconfig}",
                   "-n", NAMESPACE, "get", "applications",
                   f"--field-selector=metadata.name={self.name}", "--watch", "--output-watch-events",
                   "-o", "json"]
        with open(self.path, "wb") as out, open(self.path.with_suffix(".err"), "wb") as err:
            self.process = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def versions(self) -> list[dict[str, Any]]:
        assert self.process is not None, "record() starts the watch"
        if self.process.poll() is not None:
            raise RuntimeError(f"the watch on {self.name} ended ({self.process.returncode}): "
                               f"{self.path.with_suffix('.err').read_text()[-2000:]}")
        text, decoder, found, at = self.path.read_text(), json.JSONDecoder(), [], 0
        while (at := _skip_space(text, at)) < len(text):
            event, at = decoder.raw_decode(text, at)
            found.append(event["object"])
        return found

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process.pid, f"watch {self.name}")
            self.process = None


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


@dataclass
class ArgoCd:
    cluster: ControlPlane
    root: Path
    bin_dir: Path
    helm_dir: Path
    git_port: int = field(default_factory=free_port)
    redis_port: int = field(default_factory=free_port)
    repo_port: int = field(default_factory=free_port)
    pids: dict[str, int] = field(default_factory=dict)
    recorders: list[ApplicationRecord] = field(default_factory=list)

    @property
    def repo(self) -> Path:
        return self.root / "git" / REPO_NAME

    @property
    def repo_url(self) -> str:
        return f"git://127.0.0.1:{self.git_port}/{REPO_NAME}"

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self._commit_working_tree()
        self._install_into_cluster()
        self._spawn("git-daemon", ["git", "daemon", f"--base-path={self.root / 'git'}", "--export-all",
                                   "--reuseaddr", "--listen=127.0.0.1", f"--port={self.git_port}",
                                   str(self.root / "git")])
        self._spawn("redis", ["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port),
                              "--save", "", "--appendonly", "no"])
        redis = f"127.0.0.1:{self.redis_port}"
        self._spawn("repo-server", [str(self.bin_dir / "argocd-repo-server"), "--address=127.0.0.1",
                                    f"--port={self.repo_port}", "--metrics-address=127.0.0.1",
                                    f"--metrics-port={free_port()}", "--disable-tls", "--client-ca-path=",
                                    f"--redis={redis}",
                                    "--logformat=text"])
        # --app-resync 10 with no jitter (60 s by default): the tests watch several resyncs while the
        # operator writes status.
        # --persist-resource-health: Argo CD 3 keeps each resource's health in Redis only, unless asked
        # to write it into the Application's status.resources too, where the tests (like kubectl) read it.
        self._spawn("application-controller", [
            str(self.bin_dir / "argocd-application-controller"), f"--kubeconfig={self.cluster.kubeconfig}",
            f"--namespace={NAMESPACE}", f"--repo-server=127.0.0.1:{self.repo_port}", "--repo-server-plaintext",
            f"--redis={redis}", f"--metrics-port={free_port()}", "--app-resync=10", "--app-resync-jitter=0",
            "--status-processors=2", "--operation-processors=2", "--persist-resource-health", "--logformat=text"])

    def stop(self) -> None:
        for recorder in self.recorders:
            recorder.stop()
        for name, pid in reversed(list(self.pids.items())):
            stop_process(pid, name)
        self.pids.clear()

    # ---- what a user does -----------------------------------------------------------------

    def apply(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "--server-side", "--field-manager=e2e-user", "-f", "-",
                             input_text=json.dumps(obj))

    def application(self, name: str) -> dict[str, Any]:
        return json.loads(self.cluster.kubectl("-n", NAMESPACE, "get", "application", name, "-o", "json").stdout)

    def sync(self, name: str, *, prune: bool) -> None:
        """Ask for a sync the way the CLI does: an operation on the Application."""
        operation = {"initiatedBy": {"username": "e2e"},
                     "sync": {"revision": "HEAD", "prune": prune, "syncStrategy": {"hook": {}}}}
        self.cluster.kubectl("-n", NAMESPACE, "patch", "application", name, "--type=merge",
                             "-p", json.dumps({"operation": operation}))

    def refresh(self, name: str) -> None:
        self.cluster.kubectl("-n", NAMESPACE, "annotate", "application", name, "--overwrite",
                             "argocd.argoproj.io/refresh=hard")

    def commit(self, message: str) -> str:
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-m", message)
        return git(self.repo, "rev-parse", "HEAD")

    def record(self, name: str) -> ApplicationRecord:
        """Start recording every version of Application `name` the API server sends (a watch)."""
        recorder = ApplicationRecord(self.cluster, name, self.root / "logs" / f"watch-{name}.json")
        recorder.start()
        self.recorders.append(recorder)
        return recorder

    def log(self, name: str) -> str:
        path = self.root / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- internals ------------------------------------------------------------------------

    def _commit_working_tree(self) -> None:
        """A user's Git server holds commits: commit the working tree's folders (changes included)."""
        if self.repo.exists():
            shutil.rmtree(self.repo)
        self.repo.mkdir(parents=True)
        for folder in SERVED_FOLDERS:
            shutil.copytree(PROJECT_ROOT / folder, self.repo / folder,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        git(self.repo, "init", "-q", "-b", "main")
        self.commit("rocshare working tree")

    def _install_into_cluster(self) -> None:
        """Argo CD's CRDs (from its module), namespace, settings and default project."""
        crds = self.bin_dir.parent / "crds"
        self.cluster.kubectl("apply", "--server-side", "-f", str(crds))
        # `kubectl wait` fails, rather than waits, on a definition whose status is not written yet.
        for _ in range(20):
            waited = self.cluster.kubectl("wait", "--for=condition=Established", "crd", "applications.argoproj.io",
                                          "appprojects.argoproj.io", "--timeout=60s", check=False)
            if waited.returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"Argo CD's CRDs not established: {waited.stderr}")
        settings = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-cm", "namespace": NAMESPACE,
                                                                   "labels": PART_OF_ARGOCD}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-rbac-cm", "namespace": NAMESPACE,
                                                                   "labels": PART_OF_ARGOCD}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "argocd-secret", "namespace": NAMESPACE,
                                                                "labels": PART_OF_ARGOCD},
             "stringData": {"server.secretkey": os.urandom(16).hex()}},
            {"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
             "metadata": {"name": "default", "namespace": NAMESPACE},
             "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
                      "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]}},
        ]
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump_all(settings))
        # The shipped health checks, merged into argocd-cm as manifests/argocd/README.md says.
        self.cluster.kubectl("-n", NAMESPACE, "patch", "configmap", "argocd-cm", "--patch-file",
                             str(PROJECT_ROOT / "manifests" / "argocd" / "argocd-cm-health.yaml"))

    def _spawn(self, name: str, command: list[str]) -> None:
        # ARGOCD_FAKE_IN_CLUSTER: the Applications' destination https://kubernetes.default.svc (the
        # cluster Argo CD runs in) is reached through KUBECONFIG, as Argo CD's own local runs do, since
        # no service-account token is mounted here. GPG (signature checks) is off: nothing is signed.
        env = {**os.environ, "ARGOCD_GPG_ENABLED": "false", "ARGOCD_FAKE_IN_CLUSTER": "true",
               "KUBECONFIG": str(self.cluster.kubeconfig), "TMPDIR": str(self.root),
               "PATH": f"{self.bin_dir}:{self.helm_dir}:{os.environ['PATH']}", "HOME": str(self.root)}
        with open(self.root / "logs" / f"{name}.log", "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env=env)
        self.pids[name] = process.pid
        time.sleep(0.2)
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited at once ({process.returncode}): {self.log(name)[-2000:]}")
