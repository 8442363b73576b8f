"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, built by controlplane/build.sh for the Kubernetes
version K8S_VERSION names (default: controlplane/k8s/default-version) into .cache/k8s/<version>/bin.

Used by the e2e tests (one per test session, in a temp folder, free ports), by
`make cluster-up` / `make demo` (in ./run/cluster, fixed ports) and by the benchmarks.
Flags follow controller-runtime's envtest: loopback only, generated certificates,
RBAC, admission webhooks on. The controller-manager runs so that namespaces finish
deleting, default ServiceAccounts appear, owner references are garbage-collected and
quotas are counted; its node-lifecycle controller is off, since simulated nodes are
restarted on purpose and must not be tainted and evicted for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rocshare_dev.devcluster import certs

PROJECT_ROOT = Path(__file__).resolve().parents[3]
DRA_SCHEDULER_CONFIG = PROJECT_ROOT / "manifests" / "base" / "scheduler" / "kube-scheduler-dra-config.yaml"
VERSIONS_DIR = PROJECT_ROOT / "controlplane" / "k8s"
DEFAULT_K8S_VERSION = (VERSIONS_DIR / "default-version").read_text().strip()
DRA_K8S_VERSION = "1.37.2"
"""The version the DRA e2e (tests/e2e/dra) runs on, whatever K8S_VERSION is: consumable capacity
(DRAConsumableCapacity) is beta and on by default from 1.36. `make test` builds it beside the default
(Makefile DRA_K8S_VERSION, the same value)."""


def k8s_version() -> str:
    """The Kubernetes version the control plane is built at: K8S_VERSION (as `make ... K8S_VERSION=1.37.2`
    passes it down), else the default; "1.37.2" form, no leading v."""
    return os.environ.get("K8S_VERSION", "").strip().removeprefix("v") or DEFAULT_K8S_VERSION


def supported_k8s_versions() -> list[str]:
    """Every version with module files in controlplane/k8s (what `make test-matrix` runs), oldest first."""
    versions = [path.parent.name for path in VERSIONS_DIR.glob("*/go.mod")]
    return sorted(versions, key=lambda v: tuple(int(part) for part in v.split(".")))


def bin_dir(version: str | None = None) -> Path:
    """Where controlplane/build.sh puts that version's binaries (ROCSHARE_BIN_DIR overrides it): the one
    place that resolves the bin dir, for the dev harness, the tests and the real-node rig."""
    override = os.environ.get("ROCSHARE_BIN_DIR")
    if override:
        return Path(override)
    return PROJECT_ROOT / ".cache" / "k8s" / (version or k8s_version()) / "bin"


DEFAULT_BIN_DIR = bin_dir()
SCHEDULER_CONFIG = PROJECT_ROOT / "manifests" / "base" / "scheduler" / "kube-scheduler-config.yaml"
SERVICE_CIDR = "10.0.0.0/24"


class ControlPlaneError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def controllers_off(version: str) -> list[str]:
    """The controller-manager's controllers the local control plane turns off: node lifecycle (it would
    taint and evict the simulated nodes restarted on purpose), node IPAM, and, up to 1.36, the cloud
    ones (service load balancers, node routes), which 1.37 no longer has: naming an unknown
    controller is an error there."""
    minor = int(version.split(".")[1])
    return ["node-lifecycle-controller", "node-ipam-controller",
            *(["service-lb-controller", "node-route-controller"] if minor < 37 else [])]


def dra_feature_gates(version: str) -> tuple[str, ...]:
    """The gates a node serving DRA shares needs on every component (API server, controller-manager,
    scheduler, kubelet): consumable capacity is alpha and off up to 1.35, beta and on from 1.36.
    Without it the API server drops `allowMultipleAllocations` and every claim takes a whole GPU."""
    return ("DRAConsumableCapacity=true",) if int(version.split(".")[1]) < 36 else ()


DRA_SCHEDULER_FEATURE_GATES = ("NominatedNodeNameForExpectation=false",)
"""What DRA mode's kube-scheduler container adds (manifests/base/operator/deployment.yaml): no
status.nominatedNodeName write per pod before its claim is written (docs/dra.md, "Performance")."""


def mutating_admission_policy_args(version: str) -> tuple[str, ...]:
    """What kube-apiserver needs to serve MutatingAdmissionPolicy: on 1.34-1.35 the beta gate and
    API (admissionregistration.k8s.io/v1beta1); nothing from 1.36, where it is GA and served as
    v1 by default (and v1beta1 stays off, as on a stock cluster)."""
    if int(version.split(".")[1]) >= 36:
        return ()
    return ("--feature-gates=MutatingAdmissionPolicy=true", "--runtime-config=admissionregistration.k8s.io/v1beta1=true")


@dataclass
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    extender: int = 31990

    @classmethod
    def free(cls, extender: int | None = None) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port(), extender or free_port())

    @classmethod
    def fixed(cls) -> Ports:
        """The ports `make cluster-up` and `make demo` use, so a kubeconfig stays valid across runs."""
        return cls(etcd_client=32379, etcd_peer=32380, apiserver=36443, controller_manager=36457,
                   scheduler=36459, extender=31990)


@dataclass(frozen=True)
class WebhookClientAuth:
    """Files that make kube-apiserver present a client certificate to the admission webhooks at
    `targets` (each `host:port` as the webhook's URL names it, or `<service>.<namespace>.svc:<port>`):
    pass `apiserver_arg` in ControlPlane.extra_apiserver_args and `client_ca` to the operator's
    --webhook-client-ca. Opt-in: a control plane without it presents nothing, as before."""
    client_ca: Path
    kubeconfig: Path
    admission_config: Path

    @property
    def apiserver_arg(self) -> str:
        return f"--admission-control-config-file={self.admission_config}"


def write_webhook_client_auth(folder: Path, targets: tuple[str, ...]) -> WebhookClientAuth:
    """A CA of its own (not the cluster's: the webhook trusts only this one), a client certificate
    for kube-apiserver signed by it, the kubeconfig whose users are named by the webhooks' host:port
    (k8s.io/apiserver pkg/util/webhook/authentication.go looks them up so), and an
    AdmissionConfiguration pointing both webhook admission plugins at that kubeconfig."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = certs.make_ca(folder, "webhook-client-ca")
    pair = certs.issue(ca, folder, "apiserver-webhook-client", common_name="kube-apiserver-webhook-client")
    kubeconfig = folder / "webhook-client.kubeconfig"
    user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    kubeconfig.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config",
                                          "users": [{"name": target, "user": user} for target in targets]}))
    kubeconfig.chmod(0o600)
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(kubeconfig)}
    admission = folder / "admission-config.yaml"
    admission.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": plugin}
                    for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")]}))
    return WebhookClientAuth(client_ca=ca.cert, kubeconfig=kubeconfig, admission_config=admission)


@dataclass
class ControlPlane:
    root: Path
    ports: Ports
    bin_dir: Path = DEFAULT_BIN_DIR
    with_scheduler: bool = True
    pids: dict[str, int] = field(default_factory=dict)
    # Run every component through this command (the real-node rig: `nsenter --net=...`, so the
    # control plane lives in the rig's network namespace), and give the API server these flags too.
    command_prefix: tuple[str, ...] = ()
    extra_apiserver_args: tuple[str, ...] = ()
    # `Name=true` feature gates for the API server, controller-manager and scheduler (each flag
    # a separate `--feature-gates`: the components merge repeated ones).
    feature_gates: tuple[str, ...] = ()
    # The Kubernetes version of this control plane when it is not the session's (K8S_VERSION): the
    # DRA e2e runs its own 1.37 control plane beside a 1.35 one. Picks that version's binaries and flags.
    version: str | None = None

    def __post_init__(self) -> None:
        if self.version and self.bin_dir == DEFAULT_BIN_DIR:
            self.bin_dir = bin_dir(self.version)

    @property
    def k8s_version(self) -> str:
        return self.version or k8s_version()

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self, *, timeout_s: float = 90.0) -> None:
        """Start every component and wait until the API server is ready; idempotent per folder."""
        self._check_binaries()
        for folder in (self.root, self.pki, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self._write_pki()
        self._spawn("etcd", self._etcd_args())
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait_ready(timeout_s)
        self._spawn("kube-controller-manager", self._controller_manager_args())
        if self.with_scheduler:
            self.start_scheduler()
        self._save_state()

    def start_scheduler(self, *, config_path: Path | None = None) -> None:
        path = config_path or self._write_scheduler_config()
        self._spawn("kube-scheduler", [f"--config={path}", "--bind-address=127.0.0.1",
                                       f"--secure-port={self.ports.scheduler}", "-v=1",
                                       *self._feature_gate_args()])
        self._save_state()

    def start_default_scheduler(self) -> None:
        """A plain kube-scheduler for the pods of `default-scheduler`, as a cluster's own scheduler runs
        beside rocshare's: DRA pods stay with it (its DRA plugin allocates their claims). The dev
        control plane otherwise runs rocshare's profile only. No leader election, no serving port."""
        path = self.root / "default-scheduler-config.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "clientConnection": {"kubeconfig": str(self.kubeconfig), "qps": 200, "burst": 400}}))
        self._spawn("default-scheduler", [f"--config={path}", "--secure-port=0", "-v=1", *self._feature_gate_args()],
                    binary="kube-scheduler")
        self._save_state()

    def stop_default_scheduler(self) -> None:
        self._stop_component("default-scheduler")

    def start_dra_scheduler(self, extender_url: str, *, settings: Mapping[str, Any] | None = None,
                            qps: float | None = None, burst: int | None = None) -> str:
        """kube-scheduler with the configuration DRA mode ships (DRA_SCHEDULER_CONFIG: the allocator, and
        the operator's prioritize-dra at `extender_url`), as the operator's pod runs it: the webhook sends
        the pods it gives claims to this profile. Overrides: `settings`, more top-level configuration
        fields (bench replay's longer backoffs), and the client's `qps` and `burst` (unset: the
        client's defaults, as shipped). Returns the profile's schedulerName; it runs as component
        "dra-scheduler" (self.pids)."""
        config = {**yaml.safe_load(DRA_SCHEDULER_CONFIG.read_text()), **(settings or {})}
        config["clientConnection"] = {"kubeconfig": str(self.kubeconfig),
                                      **({"qps": qps} if qps is not None else {}),
                                      **({"burst": burst} if burst is not None else {})}
        config["leaderElection"] = {"leaderElect": False}
        for extender in config["extenders"]:
            extender["urlPrefix"] = extender_url
        path = self.root / "kube-scheduler-dra.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        gates = ",".join((*self.feature_gates, *DRA_SCHEDULER_FEATURE_GATES))
        self._spawn("dra-scheduler", [f"--config={path}", "--secure-port=0", "-v=2", f"--feature-gates={gates}"],
                    binary="kube-scheduler")
        self._save_state()
        return config["profiles"][0]["schedulerName"]

    def stop_dra_scheduler(self) -> None:
        self._stop_component("dra-scheduler")

    def _stop_component(self, name: str) -> None:
        pid = self.pids.pop(name, None)
        if pid:
            stop_process(pid, name)
        self._save_state()

    def stop(self) -> None:
        """Stop every component started from this folder (also ones from an earlier process)."""
        for name, pid in reversed(list(self._known_pids().items())):
            stop_process(pid, name)
        self.pids.clear()
        state = self.root / "state.json"
        if state.exists():
            state.unlink()

    def restart_apiserver(self, *, timeout_s: float = 60.0) -> None:
        """Kill kube-apiserver and start it again with the same flags (for fault tests)."""
        stop_process(self.pids.pop("kube-apiserver"), "kube-apiserver", sig=signal.SIGKILL)
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait_ready(timeout_s)
        self._save_state()

    # ---- helpers for callers ------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None,
                timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(command, capture_output=True, text=True, input=input_text, timeout=timeout_s)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def user_kubeconfig(self, user: str, group: str | None = None) -> Path:
        """A kubeconfig for another client-certificate user (RBAC applies; grant it roles yourself)."""
        path = self.root / f"kubeconfig-{user}"
        if not path.exists():
            ca = certs.KeyPair(self.pki / "ca.crt", self.pki / "ca.key")
            certs.issue(ca, self.pki, user, common_name=user, organization=group)
            self._write_kubeconfig(path, user)
        return path

    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    # ---- internals ------------------------------------------------------------------------

    def _check_binaries(self) -> None:
        missing = [name for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
                   if not (self.bin_dir / name).exists()]
        if missing:
            raise ControlPlaneError(f"missing {', '.join(missing)} in {self.bin_dir}: run `make controlplane` first")

    def _write_pki(self) -> None:
        if (self.pki / "admin.crt").exists():
            return
        ca = certs.make_ca(self.pki, "ca")
        certs.issue(ca, self.pki, "apiserver", common_name="kube-apiserver", server=True,
                    dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
                    ip_addresses=("127.0.0.1", "10.0.0.1"))
        certs.issue(ca, self.pki, "admin", common_name="rocshare-admin", organization="system:masters")
        certs.make_signing_key(self.pki, "service-account")
        self._write_kubeconfig(self.kubeconfig, "admin")

    def _write_kubeconfig(self, path: Path, client: str) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "rocshare-local",
            "clusters": [{"name": "rocshare-local", "cluster": {
                "server": self.server_url(), "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": client, "user": {
                "client-certificate": str(self.pki / f"{client}.crt"), "client-key": str(self.pki / f"{client}.key")}}],
            "contexts": [{"name": "rocshare-local", "context": {"cluster": "rocshare-local", "user": client}}],
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _etcd_args(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        return [f"--data-dir={self.root / 'etcd'}", f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}", "--unsafe-no-fsync=true", "--quota-backend-bytes=4294967296",
                "--log-level=warn"]

    def _apiserver_args(self) -> list[str]:
        pki = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.ports.apiserver}",
            # The `kubernetes` Service gets no endpoints: from 1.37 the endpoint reconcilers refuse a
            # loopback advertise address (1.35 wrote 127.0.0.1 into them). Nothing here reads them:
            # pods on the real node reach the API server through a DNAT rule from the Service's
            # ClusterIP (rocshare_dev.realnode.network), and everything else through the kubeconfig.
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'service-account.pub'}",
            f"--service-account-signing-key-file={pki / 'service-account.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=RBAC", "--allow-privileged=true",
            # Loopback tests create pods in bursts; the default in-flight limits would throttle them.
            "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
            "--enable-priority-and-fairness=false", "--event-ttl=30m", "-v=1",
            # New nodes get the not-ready taint from this plugin and lose it through the node-lifecycle
            # controller, which is off here (see the module docstring); simulated nodes report Ready.
            "--disable-admission-plugins=TaintNodesByCondition",
            # MutatingAdmissionPolicy (manifests/components/pod-defaults-policy*) is served, as beta
            # with its gate on up to 1.35, so the pod defaults can be set without a webhook call.
            # Nothing uses it unless that policy is installed.
            *mutating_admission_policy_args(self.k8s_version),
            *self.extra_apiserver_args,
            *self._feature_gate_args(),
        ]

    def _feature_gate_args(self) -> list[str]:
        return [f"--feature-gates={','.join(self.feature_gates)}"] if self.feature_gates else []

    def _controller_manager_args(self) -> list[str]:
        kubeconfig = str(self.kubeconfig)
        return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.controller_manager}", "--leader-elect=false",
                f"--service-account-private-key-file={self.pki / 'service-account.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}", "--use-service-account-credentials=false",
                f"--controllers={','.join(['*', *(f'-{name}' for name in controllers_off(self.k8s_version))])}",
                "--kube-api-qps=200", "--kube-api-burst=400", "-v=1", *self._feature_gate_args()]

    def _write_scheduler_config(self) -> Path:
        config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
        config["clientConnection"] = {"kubeconfig": str(self.kubeconfig), "qps": 500, "burst": 1000}
        config["leaderElection"] = {"leaderElect": False}
        for extender in config.get("extenders", []):
            extender["urlPrefix"] = f"http://127.0.0.1:{self.ports.extender}/extender"
        path = self.root / "kube-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _spawn(self, name: str, args: list[str], *, binary: str | None = None) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        process = subprocess.Popen([*self.command_prefix, str(self.bin_dir / (binary or name)), *args], stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.pids[name] = process.pid

    def _wait_ready(self, timeout_s: float) -> None:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        deadline = time.monotonic() + timeout_s
        last_error = "no answer"
        while time.monotonic() < deadline:
            for name, pid in self.pids.items():
                if not _alive(pid):
                    raise ControlPlaneError(f"{name} exited; see {self.logs / (name + '.log')}")
            try:
                with urllib.request.urlopen(f"{self.server_url()}/readyz", context=context, timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError as error:
                last_error = str(error)
            time.sleep(0.3)
        raise ControlPlaneError(f"kube-apiserver not ready after {timeout_s:.0f} s ({last_error}); "
                                f"see {self.logs / 'kube-apiserver.log'}")

    def _save_state(self) -> None:
        (self.root / "state.json").write_text(json.dumps({"pids": self.pids, "ports": asdict(self.ports)}))

    def _known_pids(self) -> dict[str, int]:
        state = self.root / "state.json"
        saved = json.loads(state.read_text())["pids"] if state.exists() else {}
        return {**saved, **self.pids}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as dead
        finished, _ = os.waitpid(pid, os.WNOHANG)
        return finished == 0
    except ChildProcessError:
        return True


def stop_process(pid: int, name: str = "", *, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
    """Signal a process (its whole session) and wait until it is gone; SIGKILL after the timeout."""
    for current in (sig, signal.SIGKILL):
        try:
            os.killpg(pid, current)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, current)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + (timeout_s if current != signal.SIGKILL else 5.0)
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)
    raise ControlPlaneError(f"{name or pid} did not exit")


def load(root: Path, bin_dir: Path = DEFAULT_BIN_DIR) -> ControlPlane:
    """The control plane recorded in `root` by an earlier `start` (for `make cluster-down`)."""
    state = json.loads((root / "state.json").read_text())
    return ControlPlane(root=root, ports=Ports(**state["ports"]), bin_dir=bin_dir, pids=state["pids"])
