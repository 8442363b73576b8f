"""Run the node agent: GPU discovery and health, AmdGpuNode publishing, the kubelet device
plugin for amd.com/gpu, and the monitor on :9394.

The agent serves its device plugin socket in --device-plugin-dir and registers with the
kubelet there (again whenever the kubelet restarts). Allocate answers only the pod the
rocshare scheduler committed for this node; see DESIGN.md sections 2 and 4.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from rocshare.api.container_account import DEFAULT_ACCOUNT_ROOT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"), help="host sysfs (default /sys)")
    parser.add_argument("--dev-root", type=Path, default=Path("/dev"), help="host /dev (default /dev)")
    parser.add_argument("--device-plugin-dir", type=Path, default=Path("/var/lib/kubelet/device-plugins"),
                        help="folder holding kubelet.sock (default /var/lib/kubelet/device-plugins)")
    parser.add_argument("--hook-path", default="/usr/local/vgpu",
                        help="host folder holding libamvgpu.so, mounted read-only into slice containers")
    parser.add_argument("--hook-missing", default="Refuse", choices=["Refuse", "RunWithoutLimit"],
                        help="what a memory slice gets when the hook library is missing: Refuse (Allocate fails "
                             "naming the file) or RunWithoutLimit (no LD_AUDIT, a Warning event on the pod)")
    parser.add_argument("--hook-library", default="Rocshare", choices=["Rocshare", "External"],
                        help="Rocshare: install the hook this image ships (--hook-source) into --hook-path before "
                             "offering slices; External: only verify the library an admin installed there")
    parser.add_argument("--hook-source", type=Path, default=None,
                        help="the hook library to install (default: the one in the image, "
                             "/opt/rocshare/hook/librocshare-hook.so)")
    parser.add_argument("--group-file", type=Path, default=Path("/etc/group"),
                        help="the host's group file (mounted in the agent), for the video and render group ids")
    parser.add_argument("--pod-device-dir", type=Path, default=Path("/var/lib/rocshare/pod-devices"),
                        help="host folder for per-pod device files that non-root containers can open; 'none' disables")
    parser.add_argument("--account-dir", default=DEFAULT_ACCOUNT_ROOT,
                        help="host folder for per-container account folders (docs/container-account.md): the hook's "
                             "usage and the slice's limits, mounted into slice containers; 'none': the hook keeps "
                             "its account in the container's /tmp and no limit changes without a restart")
    parser.add_argument("--exporter-url", default=None,
                        help="AMD Device Metrics Exporter /metrics URL (overrides the pool's health settings)")
    parser.add_argument("--health-interval-s", type=float, default=2.0, help="seconds between health checks")
    parser.add_argument("--cgroup-root", default="/sys/fs/cgroup",
                        help="cgroup v2 root for the dmem VRAM cap; 'none' disables it")
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"), help="host /proc, for the monitor")
    parser.add_argument("--monitor-port", type=int, default=9394, help="Prometheus port; 0 disables the monitor")
    parser.add_argument("--monitor-addr", default="0.0.0.0", help="address the monitor listens on")
    parser.add_argument("--interface", default="DevicePlugin", choices=["DevicePlugin", "DRA"],
                        help="how the node offers its GPUs: the kubelet device plugin (amd.com/gpu) or the DRA "
                             "driver gpu.rocshare.io (a ResourceSlice, kube-scheduler allocates); never both")
    parser.add_argument("--dra-plugins-dir", type=Path, default=Path("/var/lib/kubelet/plugins"),
                        help="DRA mode: the kubelet's plugins folder; the driver serves <dir>/gpu.rocshare.io/dra.sock")
    parser.add_argument("--dra-registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"),
                        help="DRA mode: the kubelet's plugin registration folder")
    parser.add_argument("--cdi-dir", type=Path, default=Path("/var/run/cdi"),
                        help="DRA mode: where prepared claims' CDI specs are written (the runtime's CDI spec folder)")
    parser.add_argument("--dra-whole-twins", action="store_true",
                        help="DRA mode: also offer each shared GPU whole, both consuming one shared counter, where "
                             "the API server serves counters; only when every kube-scheduler allocating "
                             "gpu.rocshare.io claims is 1.37+ (1.35's allocator does not count a shared device's "
                             "counters: docs/dra.md)")
    parser.add_argument("--load-check-dir", type=Path, default=Path("/var/lib/rocshare/loadcheck"),
                        help="host folder the agent installs rocshare-loadcheck into (the CDI createContainer hook "
                             "that refuses slice containers the memory hook cannot load in)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING ...")


def run(args: argparse.Namespace) -> int:
    from rocshare.api.models import AgentInterface, HookLibrary, HookMissing
    from rocshare_agent.app import AgentConfig, main
    from rocshare_agent.hook_install import SHIPPED_HOOK

    if not args.node_name:
        raise SystemExit("rocshare agent: --node-name (or $NODE_NAME) is required")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = AgentConfig(
        node_name=args.node_name, kubeconfig=args.kubeconfig, sysfs_root=args.sysfs_root, dev_root=args.dev_root,
        device_plugin_dir=args.device_plugin_dir, hook_path=args.hook_path,
        hook_missing=HookMissing(args.hook_missing), hook_library=HookLibrary(args.hook_library),
        hook_source=args.hook_source or SHIPPED_HOOK, exporter_url=args.exporter_url,
        group_file=args.group_file,
        pod_device_dir=None if str(args.pod_device_dir) == "none" else args.pod_device_dir,
        health_interval_s=args.health_interval_s,
        cgroup_root=None if args.cgroup_root == "none" else Path(args.cgroup_root),
        proc_root=args.proc_root, monitor_port=args.monitor_port, monitor_addr=args.monitor_addr,
        interface=AgentInterface(args.interface), dra_plugins_dir=args.dra_plugins_dir,
        dra_registry_dir=args.dra_registry_dir, cdi_dir=args.cdi_dir,
        dra_whole_twins=args.dra_whole_twins, load_check_dir=args.load_check_dir,
        account_dir=None if args.account_dir == "none" else Path(args.account_dir),
    )
    return main(config)
