"""An operator replica as local processes: the rocshare operator and its own kube-scheduler, as
the two containers of one operator pod (manifests/base/operator/deployment.yaml).

Each replica's kube-scheduler runs with leader election on the manifest's Lease and timings and
calls only its own extender. kube-scheduler names itself in the Lease after its hostname, and in
a pod both containers share the pod's hostname; here each replica's kube-scheduler runs in a UTS
namespace of its own with the replica's name as hostname (`unshare --uts`, root), and the
operator is told that name (`--scheduler-host`). As in the pod, kube-scheduler starts once the
operator's extender is ready (the native sidecar's startupProbe), and a graceful stop ends
kube-scheduler first, then the operator (the kubelet's order for a sidecar).

Used by tests/e2e/test_failover.py and `rocshare-dev bench failover`.
"""

from __future__ import annotations

import signal
import ssl
import subprocess
import urllib.request
from dataclasses import dataclass, field

import yaml

from rocshare_dev.devcluster.controlplane import SCHEDULER_CONFIG, ControlPlane, free_port, stop_process
from rocshare_dev.devcluster.operator_proc import OperatorProcess

PEERING_CRD = SCHEDULER_CONFIG.parents[1] / "peering" / "clusterkopfpeering.yaml"
LEASE = "rocshare-scheduler"


def install_peering(cluster: ControlPlane) -> None:
    """The ClusterKopfPeering definition (the operators create the object `rocshare`)."""
    cluster.kubectl("apply", "-f", str(PEERING_CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=30s")


@dataclass
class OperatorReplica:
    cluster: ControlPlane
    name: str
    extender_port: int = field(default_factory=free_port)
    scheduler_port: int = field(default_factory=free_port)
    operator: OperatorProcess = field(init=False)
    scheduler_pid: int | None = None

    def __post_init__(self) -> None:
        self.operator = OperatorProcess(self.cluster, extender_port=self.extender_port, standalone=False,
                                        name=f"operator-{self.name}",
                                        extra_args=(f"--scheduler-lease={LEASE}", f"--scheduler-host={self.name}"))

    def start(self, *, wait_s: float = 60.0) -> None:
        self.operator.start(wait_s=wait_s)
        self.start_scheduler()

    def start_scheduler(self) -> None:
        config = self.cluster.root / f"kube-scheduler-{self.name}.yaml"
        config.write_text(yaml.safe_dump(scheduler_config(self.cluster, self.extender_port), sort_keys=False))
        command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.name,
                   str(self.cluster.bin_dir / "kube-scheduler"), f"--config={config}", "--bind-address=127.0.0.1",
                   f"--secure-port={self.scheduler_port}", "-v=1",
                   # its own /metrics readable without credentials, as /readyz is: the tests read
                   # kube-scheduler's count of binds under way (scheduler_goroutines{operation="binding"})
                   "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"]
        with open(self.cluster.logs / f"kube-scheduler-{self.name}.log", "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        self.scheduler_pid = process.pid

    def binds_under_way(self) -> int:
        """kube-scheduler's own count of binding cycles running (its /metrics), -1 if it does not answer."""
        context = ssl._create_unverified_context()  # noqa: S323 - self-signed serving certificate
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.scheduler_port}/metrics", timeout=2,
                                        context=context) as reply:
                text = reply.read().decode()
        except OSError:
            return -1
        for line in text.splitlines():
            if line.startswith('scheduler_goroutines{operation="binding"}'):
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    def alive(self) -> bool:
        return bool(self.operator.pid and self.scheduler_pid)

    def leading(self) -> bool:
        """This replica decides: its scheduler holds the Lease and its extender knows it."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.extender_port}/leaderz", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def standing_by(self) -> bool:
        """Ready to take over: the extender synced and not deciding, its kube-scheduler serving."""
        return self._answers(f"http://127.0.0.1:{self.extender_port}/readyz", b"standby") and \
            self._answers(f"https://127.0.0.1:{self.scheduler_port}/readyz", b"ok")

    @staticmethod
    def _answers(url: str, text: bytes) -> bool:
        # kube-scheduler's serving certificate is self-signed; /readyz needs no credentials.
        context = ssl._create_unverified_context() if url.startswith("https") else None  # noqa: S323
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as reply:
                return reply.status == 200 and text in reply.read()
        except OSError:
            return False

    def crash(self) -> None:
        """SIGKILL both processes, as a node failure or an OOM kill of the pod would."""
        self.stop_scheduler(signal.SIGKILL)
        self.operator.kill()

    def delete(self) -> None:
        """A graceful pod deletion: SIGTERM kube-scheduler (it releases the Lease), then the operator."""
        self.stop_scheduler(signal.SIGTERM)
        self.operator.stop()

    def stop_scheduler(self, sig: int) -> None:
        if self.scheduler_pid:
            stop_process(self.scheduler_pid, f"kube-scheduler-{self.name}", sig=sig)
            self.scheduler_pid = None


def scheduler_config(cluster: ControlPlane, extender_port: int) -> dict:
    """The shipped configuration with its leader election, on this cluster, calling one extender."""
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig), "qps": 500, "burst": 1000}
    for extender in config.get("extenders", []):
        extender["urlPrefix"] = f"http://127.0.0.1:{extender_port}/extender"
    return config
