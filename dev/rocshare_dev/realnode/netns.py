"""A named network namespace (`ip netns`) and commands run inside it.

Commands enter only the network namespace (`nsenter --net`), not a mount namespace of their
own: the kubelet's volume mounts must be visible to containerd, and the test process must see
the rig's files (sockets, logs) at their real paths.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")


class RigError(RuntimeError):
    pass


def run(*command: str, check: bool = True, input_text: str | None = None,
        timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(command), capture_output=True, text=True, input=input_text, timeout=timeout_s)
    if check and result.returncode != 0:
        raise RigError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@dataclass(frozen=True)
class NetNamespace:
    name: str

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    @property
    def prefix(self) -> tuple[str, ...]:
        """Prepend to a command to run it in this namespace."""
        return ("nsenter", f"--net={self.path}")

    def exists(self) -> bool:
        return self.path.exists()

    def create(self) -> None:
        run("ip", "netns", "add", self.name)
        self.run("ip", "link", "set", "lo", "up")

    def delete(self) -> None:
        if self.exists():
            run("ip", "netns", "delete", self.name, check=False)

    def run(self, *command: str, check: bool = True, input_text: str | None = None,
            timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        return run(*self.prefix, *command, check=check, input_text=input_text, timeout_s=timeout_s)
