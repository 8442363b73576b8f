"""containerd for the real node, one of two runtimes (`RUNTIMES`):

* ``containerd2`` (the default): containerd 2.x and its runc shim built from their Go module
  (dev/containerd/build.sh, cached in .cache/containerd/<version>/bin) with Debian's runc. CDI
  is on in 2.x; the rig names its spec dirs, /etc/cdi and /var/run/cdi, explicitly. The whole
  tests/realnode suite passed on it before it became the default.
* ``containerd``: Debian's 1.6 (dev/realnode/install-deps.sh), the rig's runtime before. It
  cannot hand a container devices through CDI, which DRA needs.

Either starts from its own `containerd config default` with the same changes (real-node.md):
`restrict_oom_score_adj` (root here lacks CAP_SYS_RESOURCE: without it every sandbox fails with
"can't get final child's PID from pipe"), the locally built pause image as the sandbox image,
Debian's CNI plugins in /usr/lib/cni, and every path of its own: state, sockets and pod network
namespaces under the rig's run folder, nothing in the machine's own containerd paths (2.x's NRI
socket, a fixed host path, is turned off).

Its root (content store, unpacked snapshots, metadata) is the one thing kept between runs, in
`.cache/realnode-containerd` (`...-containerd2` for 2.x: 2.x migrates a 1.6 metadata store, and
1.6 must keep reading its own), with the content stamp of each image imported there: importing
the ~1.5 GB of docker archives took 100 s of a 2-minute start on a loaded machine, and an
unchanged image need not be imported again. The kubelet's image GC is off (thresholds 100 %),
and `down` deletes every container, so only images stay.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT
from rocshare_dev.realnode.netns import NetNamespace, RigError, run

PAUSE_IMAGE = "localhost/rocshare/pause:dev"
NAMESPACE = "k8s.io"
CONTAINERD2_BUILD = PROJECT_ROOT / "dev" / "containerd" / "build.sh"
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")

# Each runtime's changes to its default config: a line pattern (one match required) -> its
# replacement, {placeholders} filled by write_config. 1.6 writes config version 2 (double
# quotes), 2.x version 3 and later (single quotes, CRI split into images and runtime plugins).
_EDITS_1_6 = {
    r'^root = ".*"$': 'root = "{root}"',
    r'^state = ".*"$': 'state = "{state}"',
    r'^(\s*)restrict_oom_score_adj = false$': r"\1restrict_oom_score_adj = true",
    r'^(\s*)netns_mounts_under_state_dir = false$': r"\1netns_mounts_under_state_dir = true",
    r'^(\s*)sandbox_image = ".*"$': r'\1sandbox_image = "{pause}"',
    r'^(\s*)bin_dir = "/opt/cni/bin"$': r'\1bin_dir = "/usr/lib/cni"',
    r'^(\s*)conf_dir = "/etc/cni/net.d"$': r'\1conf_dir = "{cni_conf_dir}"',
    r'^(\s*)path = "/opt/containerd"$': r'\1path = "{opt}"',
    # The [grpc] socket (the first address of the default socket; [ttrpc] takes its name from it).
    r'^(\s*)address = "/run/containerd/containerd.sock"$': r'\1address = "{socket}"',
}
_EDITS_2 = {
    r"^root = '.*'$": "root = '{root}'",
    r"^state = '.*'$": "state = '{state}'",
    r"^(\s*)restrict_oom_score_adj = false$": r"\1restrict_oom_score_adj = true",
    r"^(\s*)netns_mounts_under_state_dir = false$": r"\1netns_mounts_under_state_dir = true",
    r"^(\s*)sandbox = '.*'$": r"\1sandbox = '{pause}'",
    r"^(\s*)bin_dirs = \['/opt/cni/bin'\]$": r"\1bin_dirs = ['/usr/lib/cni']",
    r"^(\s*)conf_dir = '/etc/cni/net.d'$": r"\1conf_dir = '{cni_conf_dir}'",
    r"^(\s*)path = '/opt/containerd'$": r"\1path = '{opt}'",
    r"^(\s*)address = '/run/containerd/containerd.sock'$": r"\1address = '{socket}'",
    r"^(\s*)address = '/run/containerd/containerd.sock.ttrpc'$": r"\1address = '{socket}.ttrpc'",
    r"^(\s*)cdi_spec_dirs = \[.*\]$": r"\1cdi_spec_dirs = [{cdi_spec_dirs}]",
    r"^(\s*\[plugins.'io.containerd.nri.v1.nri'\]\n\s*)disable = false$": r"\1disable = true",
}


@dataclass(frozen=True)
class Runtime:
    name: str
    edits: dict[str, str]
    root: Path
    """Kept between runs (see the module docstring)."""
    build: Path | None = None
    """The script that builds it and prints its bin folder; None: the host's (Debian's) binaries."""

    def bin_dir(self) -> Path | None:
        if self.build is None:
            return None
        built = run(str(self.build), timeout_s=3600.0)  # cached by a stamp: instant when built
        return Path(built.stdout.strip().splitlines()[-1])


RUNTIMES = {
    "containerd": Runtime("containerd", _EDITS_1_6, PROJECT_ROOT / ".cache" / "realnode-containerd"),
    "containerd2": Runtime("containerd2", _EDITS_2, PROJECT_ROOT / ".cache" / "realnode-containerd2",
                           build=CONTAINERD2_BUILD),
}
DEFAULT_RUNTIME = "containerd2"  # CDI, for DRA


class Containerd:
    def __init__(self, folder: Path, *, runtime: Runtime = RUNTIMES[DEFAULT_RUNTIME]) -> None:
        self.folder = folder
        self.runtime = runtime
        self.root = runtime.root
        self._bin_dir: Path | None = None

    @property
    def bin_dir(self) -> Path | None:
        """Where its containerd, shim and ctr are (built on first use); None: on the PATH."""
        if self._bin_dir is None and self.runtime.build is not None:
            self._bin_dir = self.runtime.bin_dir()
        return self._bin_dir

    def command(self, name: str) -> str:
        return str(self.bin_dir / name) if self.bin_dir else name

    @property
    def env(self) -> dict[str, str]:
        """containerd finds its shim on the PATH: the built one first."""
        if not self.bin_dir:
            return dict(os.environ)
        return {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"}

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
        text = run(self.command("containerd"), "config", "default").stdout
        values = {"root": self.root, "state": self.state_dir, "pause": PAUSE_IMAGE, "cni_conf_dir": cni_conf_dir,
                  "opt": self.folder / "opt", "socket": self.socket,
                  "cdi_spec_dirs": ", ".join(f"'{folder}'" for folder in CDI_SPEC_DIRS)}
        self.config.write_text(edit_config(text, self.runtime.edits, values))

    def start(self, ns: NetNamespace, log: Path) -> int:
        with open(log, "ab") as out:
            pid = subprocess.Popen([*ns.prefix, self.command("containerd"), "--config", str(self.config)],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env=self.env).pid
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RigError(f"containerd did not answer on {self.socket}; see {log}")
            time.sleep(0.2)
        return pid

    def ctr(self, *args: str, check: bool = True, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
        return run(self.command("ctr"), "--address", str(self.socket), "--namespace", NAMESPACE, *args, check=check,
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


def edit_config(text: str, edits: dict[str, str], values: dict[str, object]) -> str:
    """`text` with each edit applied once; a pattern that matches no line is an error (the
    default config changed under us: better to stop than to run on machine-wide paths)."""
    for pattern, replacement in edits.items():
        text, count = re.subn(pattern, replacement.format(**values), text, count=1, flags=re.MULTILINE)
        if count != 1:
            raise RigError(f"containerd's default config has no line matching {pattern!r}")
    return text
