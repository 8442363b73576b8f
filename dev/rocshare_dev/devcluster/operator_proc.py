"""The rocshare operator as a local process, wired to a local control plane: the
extender on the port kube-scheduler's configuration names, the admission webhook on
loopback with a certificate from the cluster's CA, and the webhook configurations
from manifests/ rewritten to reach it by URL instead of through a Service. On request
(`install_webhooks(admission_policies=True)`) the pod admission policies instead: the
ValidatingAdmissionPolicy and, where the API server serves it, the pod-defaults
MutatingAdmissionPolicy, which leaves the webhooks out (issue 18); the policies are removed
again by `stop()`.

Used by the e2e tests (which kill and restart it) and by `make demo`.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rocshare_dev.devcluster import certs
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, ControlPlane, free_port, stop_process

WEBHOOKS = PROJECT_ROOT / "manifests" / "base" / "webhook" / "webhooks.yaml"
POD_POLICY = PROJECT_ROOT / "manifests" / "base" / "policy" / "pods.yaml"
POD_DEFAULTS_COMPONENTS = {"v1": PROJECT_ROOT / "manifests" / "components" / "pod-defaults-policy-v1",
                           "v1beta1": PROJECT_ROOT / "manifests" / "components" / "pod-defaults-policy"}
"""The pod-defaults MutatingAdmissionPolicy's kustomize component for each API version serving it."""
TRUSTED_USERS_CONDITION = "not-from-rocshare"
"""The webhook matchCondition listing rocshare's own users, whose writes skip the validating webhook."""


@dataclass
class OperatorProcess:
    cluster: ControlPlane
    metrics_port: int = field(default_factory=free_port)
    webhook_port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    command: tuple[str, ...] = (sys.executable, "-m", "rocshare.cli")
    """How to run `rocshare`: this interpreter's by default; an installed one's entry point to test
    what users install (tests/e2e/test_runtime_install.py)."""
    pid: int | None = None
    extender_port: int | None = None
    """The extender's port; None: the one the control plane's kube-scheduler calls."""
    standalone: bool = True
    """Kopf without peering; False peers through ClusterKopfPeering `rocshare` (replica.py installs it)."""
    name: str = "operator"
    """Names the log file (replicas run side by side)."""
    policies: tuple[str, ...] = ()
    """The admission policies `install_webhooks` created ("kind/name" for kubectl), removed by `stop`."""

    @property
    def log_path(self) -> Path:
        return self.cluster.logs / f"{self.name}.log"

    @property
    def port(self) -> int:
        return self.extender_port or self.cluster.ports.extender

    def start(self, *, wait_s: float = 60.0) -> None:
        # The operator's own namespace (node-agent DaemonSets go there), as the manifests create it.
        self.cluster.kubectl("apply", "-f", "-", input_text='{"apiVersion":"v1","kind":"Namespace",'
                                                            '"metadata":{"name":"rocshare-system"}}')
        pair = self._webhook_cert()
        command = [*self.command, "operator", f"--kubeconfig={self.cluster.kubeconfig}",
                   *(["--standalone"] if self.standalone else []), "--namespace=rocshare-system",
                   f"--extender-port={self.port}", f"--metrics-port={self.metrics_port}",
                   f"--webhook-port={self.webhook_port}", "--webhook-host=127.0.0.1",
                   f"--webhook-cert={pair.cert}", f"--webhook-key={pair.key}",
                   f"--trusted-user={_admin_user()}", *self.extra_args]
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.pid = process.pid
        self._wait_ready(wait_s)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.pid:
            stop_process(self.pid, "operator", sig=signal.SIGKILL)
            self.pid = None

    def stop(self) -> None:
        if self.pid:
            stop_process(self.pid, self.name)
            self.pid = None
        if self.policies:
            remove_admission_policies(self.cluster, self.policies)
            self.policies = ()

    def install_webhooks(self, *, admission_policies: bool = False) -> None:
        """Create the manifests' webhook configurations, pointed at this process, which runs as
        the control plane's admin user (so that user is trusted as rocshare's accounts are);
        with `admission_policies`, the pod admission policies first (see the module docstring),
        and where the API server serves the pod-defaults MutatingAdmissionPolicy no webhook at all:
        its component renders none (manifests/components/pod-defaults-policy), as a user's overlay."""
        if admission_policies:
            self.install_admission_policies()
            if self.mutating_admission_policy_version():
                return
        ca_bundle = base64.b64encode((self.cluster.pki / "ca.crt").read_bytes()).decode()
        documents = []
        for document in yaml.safe_load_all(WEBHOOKS.read_text()):
            for hook in document["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": ca_bundle}
                for condition in hook.get("matchConditions", []):
                    if condition["name"] == TRUSTED_USERS_CONDITION:
                        condition["expression"] = _also_trusting(condition["expression"], _admin_user())
            documents.append(document)
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                             input_text=yaml.safe_dump_all(documents))
        self.wait_webhook_serving()

    def install_admission_policies(self) -> None:
        """The ValidatingAdmissionPolicy (admin user trusted as in the webhooks), and the pod-defaults
        MutatingAdmissionPolicy when the API server serves it (controlplane.py turns it on)."""
        documents = list(yaml.safe_load_all(POD_POLICY.read_text()))
        for document in documents:
            for variable in document["spec"].get("variables", []):
                if variable["name"] == "trusted":
                    variable["expression"] = variable["expression"].replace("[", f"['{_admin_user()}', ", 1)
        served = self.mutating_admission_policy_version()
        if served:
            documents += self._component_documents(POD_DEFAULTS_COMPONENTS[served])
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                             input_text=yaml.safe_dump_all(documents))
        self.policies = tuple(f"{document['kind'].lower()}.{document['apiVersion'].split('/')[0]}/"
                              f"{document['metadata']['name']}" for document in documents)

    def wait_admission_params(self, runtime_classes: dict[str, str] | None = None, *, timeout_s: float = 60.0) -> None:
        """Until the policy parameters (ConfigMap rocshare-admission, written by a running operator
        every few seconds) name exactly these pools' RuntimeClasses and no other pool's: pods created
        before that are refused (no parameters) or take a pool that is gone (an earlier module's)."""
        expected = {f"pool.{pool}": runtime_class for pool, runtime_class in (runtime_classes or {}).items()}
        deadline, data = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            result = self.cluster.kubectl("get", "configmap", "rocshare-admission", "-n", "rocshare-system", "-o",
                                          "json", check=False)
            data = json.loads(result.stdout).get("data") or {} if result.returncode == 0 else None
            if data is not None and {k: v for k, v in data.items() if k.startswith("pool.")} == expected \
                    and data.get("onlyPool") in (None, *expected.values()):
                return
            time.sleep(0.5)
        raise TimeoutError(f"the admission policy parameters never named just {expected}: {data}")

    def mutating_admission_policy_version(self) -> str | None:
        """The API version serving MutatingAdmissionPolicy: v1 from 1.36 (GA), v1beta1 on 1.34-1.35 with
        its gate on (controlplane.mutating_admission_policy_args), None where it is not served."""
        for version in ("v1", "v1beta1"):
            result = self.cluster.kubectl("get", "--raw", f"/apis/admissionregistration.k8s.io/{version}", check=False)
            if result.returncode == 0 and any(resource["name"] == "mutatingadmissionpolicies"
                                              for resource in json.loads(result.stdout)["resources"]):
                return version
        return None

    def serves_mutating_admission_policy(self) -> bool:
        return self.mutating_admission_policy_version() is not None

    def _component_documents(self, component: Path) -> list[dict]:
        """A kustomize component rendered as a user's overlay renders it (kubectl kustomize)."""
        overlay = self.cluster.root / f"overlay-{component.name}"
        overlay.mkdir(exist_ok=True)
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "components": [os.path.relpath(component, overlay)]}))
        return list(yaml.safe_load_all(self.cluster.kubectl("kustomize", str(overlay)).stdout))

    def wait_webhook_serving(self, timeout_s: float = 30.0) -> None:
        """start() returns once the extender answers; Kopf's webhook server may need a moment
        more. A server-side dry run of a GPU pod passes through both webhooks."""
        probe = json.dumps({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": "webhook-probe", "namespace": "default"},
                            "spec": {"containers": [{"name": "c", "image": "probe",
                                                     "resources": {"limits": {"amd.com/gpu": "1"}}}]}})
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.cluster.kubectl("create", "--dry-run=server", "-f", "-", input_text=probe, check=False)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the webhook did not answer within {timeout_s:.0f} s: {result.stderr.strip()}")
            time.sleep(0.3)

    def _webhook_cert(self) -> certs.KeyPair:
        pair = certs.KeyPair(self.cluster.pki / "webhook.crt", self.cluster.pki / "webhook.key")
        if pair.cert.exists():
            return pair
        ca = certs.KeyPair(self.cluster.pki / "ca.crt", self.cluster.pki / "ca.key")
        return certs.issue(ca, self.cluster.pki, "webhook", common_name="rocshare-webhook", server=True,
                           dns_names=("localhost", "rocshare-webhook.rocshare-system.svc"),
                           ip_addresses=("127.0.0.1",))

    def readyz(self) -> tuple[str, ssl.SSLContext | None]:
        """The extender's readiness URL and the TLS context to reach it with (None: plain HTTP)."""
        return f"http://127.0.0.1:{self.port}/readyz", None

    def _wait_ready(self, wait_s: float) -> None:
        url, context = self.readyz()

        def exited() -> str | None:
            return f"the operator exited; see {self.log_path}" if self.pid and not _alive(self.pid) else None

        if not wait_ready(url, wait_s, exited=exited, context=context):
            raise RuntimeError(f"the operator's extender was not ready after {wait_s:.0f} s; see {self.log_path}")


def wait_ready(url: str, timeout_s: float, *, exited: Callable[[], str | None],
               context: ssl.SSLContext | None = None) -> bool:
    """Poll `url` until it answers 200 (True) or `timeout_s` passes (False). `exited` says why the
    process behind it is gone, or None while it runs; a reason is raised as RuntimeError at once."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gone = exited()
        if gone:
            raise RuntimeError(gone)
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as reply:
                if reply.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def _also_trusting(expression: str, user: str) -> str:
    """Add `user` to the username list of the trusted-users condition (`!(... in ['a', 'b'])`)."""
    head, bracket, tail = expression.partition("[")
    if not bracket:
        raise ValueError(f"matchCondition {TRUSTED_USERS_CONDITION} has no list of users: {expression}")
    return f"{head}['{user}', {tail}"


def _admin_user() -> str:
    """The control plane's admin client (tests drive the cluster as it; see controlplane.py)."""
    return "rocshare-admin"


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        return finished == 0
    except ChildProcessError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def remove_admission_policies(cluster: ControlPlane, policies: tuple[str, ...]) -> None:
    """Delete the policies `install_admission_policies` made. Seen on kube-apiserver 1.35: once a
    MutatingAdmissionPolicy and its binding were deleted, the same policy applied again went on
    reading its parameters (ConfigMap rocshare-admission) as they were at the deletion, whatever
    was written since; a restart of the API server after the removal gives the next module's
    policies parameters that follow the ConfigMap."""
    cluster.kubectl("delete", *policies, "--ignore-not-found", check=False)
    if any(policy.startswith("mutatingadmissionpolicy") for policy in policies):
        cluster.restart_apiserver()
