"""The real-node rig's container runtimes (dev/rocshare_dev/realnode/containerd.py): the config
edits are all-or-nothing (a default config that lost a line stops the rig rather than letting it
run on the machine's own containerd paths), and 2.x's NRI (a socket at a fixed host path) is turned off."""

from __future__ import annotations

import pytest

from rocshare_dev.realnode.containerd import _EDITS_2, RUNTIMES, edit_config
from rocshare_dev.realnode.netns import RigError
from rocshare_dev.realnode.rig import RealNode

# The lines of containerd 2.4's `containerd config default` the rig edits (a few neighbours kept).
DEFAULT_2 = """version = 4
root = '/var/lib/containerd'
state = '/run/containerd'
[plugins]
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10.2'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = false
    netns_mounts_under_state_dir = false
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/opt/cni/bin']
      conf_dir = '/etc/cni/net.d'
  [plugins.'io.containerd.internal.v1.opt']
    path = '/opt/containerd'
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = false
  [plugins.'io.containerd.server.v1.grpc']
    address = '/run/containerd/containerd.sock'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '/run/containerd/containerd.sock.ttrpc'
"""
VALUES = {"root": "/r", "state": "/s", "pause": "localhost/pause:dev", "cni_conf_dir": "/cni", "opt": "/opt2",
          "socket": "/run/rig/c.sock", "cdi_spec_dirs": "'/etc/cdi', '/var/run/cdi'"}


def test_every_2x_edit_lands_and_no_machine_path_is_left():
    edited = edit_config(DEFAULT_2, _EDITS_2, VALUES)
    assert "/run/containerd" not in edited and "/var/lib/containerd" not in edited and "/opt/" not in edited
    assert "address = '/run/rig/c.sock'" in edited and "address = '/run/rig/c.sock.ttrpc'" in edited
    assert "restrict_oom_score_adj = true" in edited and "sandbox = 'localhost/pause:dev'" in edited
    nri = edited.split("[plugins.'io.containerd.nri.v1.nri']")[1]
    assert nri.splitlines()[1].strip() == "disable = true"
    assert "enable = false" in nri  # its validator untouched


def test_a_missing_line_stops_the_rig():
    with pytest.raises(RigError, match="restrict_oom_score_adj"):
        edit_config(DEFAULT_2.replace("    restrict_oom_score_adj = false\n", ""), _EDITS_2, VALUES)


def test_the_runtime_is_one_the_rig_knows(tmp_path):
    assert set(RUNTIMES) == {"containerd", "containerd2"}
    assert RUNTIMES["containerd"].build is None and RUNTIMES["containerd2"].build.name == "build.sh"
    with pytest.raises(RigError, match="unknown container runtime"):
        RealNode(tmp_path, runtime="cri-o")
