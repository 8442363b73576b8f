"""The test process's way to the API server inside the rig's namespace.

Two socat processes and a unix socket in the run folder (the mount namespace is shared):
inside the namespace `UNIX-LISTEN:<run>/api.sock -> TCP:127.0.0.1:<port>`; outside
`TCP-LISTEN:127.0.0.1:<port> -> UNIX-CONNECT:<run>/api.sock`. The same port on both sides, so
one kubeconfig (https://127.0.0.1:<port>, a SAN of the API server's certificate) works from the
test process, from the components in the namespace, and through the bridge.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from rocshare_dev.realnode.netns import NetNamespace, RigError


def _spawn(command: list[str], log: Path) -> int:
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True).pid


def start(ns: NetNamespace, *, socket_path: Path, port: int, logs: Path) -> dict[str, int]:
    socket_path.unlink(missing_ok=True)
    inside = _spawn([*ns.prefix, "socat", f"UNIX-LISTEN:{socket_path},fork,mode=600",
                     f"TCP:127.0.0.1:{port}"], logs / "apibridge-inside.log")
    deadline = time.monotonic() + 10
    while not socket_path.exists():
        if time.monotonic() > deadline:
            raise RigError(f"the API bridge's socket {socket_path} did not appear")
        time.sleep(0.05)
    outside = _spawn(["socat", f"TCP-LISTEN:{port},fork,reuseaddr,bind=127.0.0.1",
                      f"UNIX-CONNECT:{socket_path}"], logs / "apibridge-outside.log")
    return {"apibridge-inside": inside, "apibridge-outside": outside}
