"""containerd for the real node: Debian's 1.6 with its default config and four changes
(real-node.md): `restrict_oom_score_adj` (root here lacks CAP_SYS_RESOURCE: without it every
sandbox fails with "can't get final child's PID from pipe"), the locally built pause image as
`sandbox_image`, Debian's CNI plugins in /usr/lib/cni, and every path of its own: state,
sockets and pod network namespaces under the rig's run folder, nothing in the machine's own
containerd paths.

Its root (content store, unpacked snapshots, metadata) is the one thing kept between runs, in
`.cache/realnode-containerd`, with the content stamp of each image imported there: importing
the ~1.5 GB of docker archives took 100 s of a 2-minute start on a loaded machine, and an
unchanged image need not be imported again. The kubelet's image GC is off (thresholds 100 %),
and `down` deletes every container, so only images stay.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from rocshare_dev.realnode.netns import NetNamespace, RigError, run

PAUSE_IMAGE = "localhost/rocshare/pause:dev"
NAMESPACE = "k8s.io"


class Containerd:
    def __init__(self, folder: Path, *, root: Path) -> None:
        self.folder = folder
        self.root = root

    @property
    def socket(self) -> Path:
        return self.folder / "containerd.sock"

    @property
    def config(self) -> Path:
        return self.folder / "config.toml"

    @property
    def state_dir(self) -> Path:
        return self.folder / "state"

    def write_config(self, *, cni_conf_dir: Path) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        text = run("containerd", "config", "default").stdout
        edits = {
            r'^root = ".*"$': f'root = "{self.root}"',
            r'^state = ".*"$': f'state = "{self.state_dir}"',
            r'^(\s*)restrict_oom_score_adj = false$': r"\1restrict_oom_score_adj = true",
            r'^(\s*)netns_mounts_under_state_dir = false$': r"\1netns_mounts_under_state_dir = true",
            r'^(\s*)sandbox_image = ".*"$': rf'\1sandbox_image = "{PAUSE_IMAGE}"',
            r'^(\s*)bin_dir = "/opt/cni/bin"$': r'\1bin_dir = "/usr/lib/cni"',
            r'^(\s*)conf_dir = "/etc/cni/net.d"$': rf'\1conf_dir = "{cni_conf_dir}"',
            r'^(\s*)path = "/opt/containerd"$': rf'\1path = "{self.folder / "opt"}"',
        }
        for pattern, replacement in edits.items():
            text, count = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
            if count != 1:
                raise RigError(f"containerd's default config has no line matching {pattern!r}")
        # The [grpc] and [ttrpc] sockets: the first `address = "/run/containerd/containerd.sock"`.
        text = text.replace('address = "/run/containerd/containerd.sock"', f'address = "{self.socket}"', 1)
        self.config.write_text(text)

    def start(self, ns: NetNamespace, log: Path) -> int:
        with open(log, "ab") as out:
            pid = subprocess.Popen([*ns.prefix, "containerd", "--config", str(self.config)], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True).pid
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RigError(f"containerd did not answer on {self.socket}; see {log}")
            time.sleep(0.2)
        return pid

    def ctr(self, *args: str, check: bool = True, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
        return run("ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args, check=check,
                   timeout_s=timeout_s)

    def import_images(self, archives: dict[Path, str]) -> list[Path]:
        """Import each archive whose stamp differs from the one recorded at its last import here
        (or whose image is gone); returns the archives imported."""
        record = self.root / "imported.json"
        imported = json.loads(record.read_text()) if record.exists() else {}
        present = set(self.ctr("images", "list", "--quiet").stdout.split())
        done = []
        for archive, (image, stamp) in archives.items():
            if imported.get(image) == stamp and image in present:
                continue
            self.ctr("images", "import", str(archive))
            imported[image] = stamp
            record.write_text(json.dumps(imported, indent=2))
            done.append(archive)
        return done

    def remove_all_tasks(self) -> None:
        """Kill every container the kubelet left (its shims outlive containerd otherwise)."""
        if self.ctr("version", check=False).returncode != 0:
            return
        listing = self.ctr("containers", "list", "--quiet", check=False).stdout.split()
        for container in listing:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", container, check=False)
        for container in listing:
            for _ in range(25):  # a killed task takes a moment to stop
                deleted = self.ctr("tasks", "delete", container, check=False)
                if deleted.returncode == 0 or "not found" in deleted.stderr:
                    break
                time.sleep(0.2)
            self.ctr("containers", "delete", container, check=False)
