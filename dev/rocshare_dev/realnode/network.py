"""The node's network, inside the rig's namespace: a bridge `cni0` (10.244.0.1/24) made before
the kubelet starts, a CNI conflist that neither turns on forwarding nor NATs (`isGateway` and
`ipMasq` off), and the one path pods need to the API server: a route to the Service range over
the bridge, `route_localnet` on cni0, and a DNAT from the `kubernetes` Service's ClusterIP:443 to
the API server's loopback port (there is no kube-proxy). The API server reaches pods directly
over the bridge, and calls webhooks on their endpoints (`--enable-aggregator-routing`).
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from rocshare_dev.realnode.netns import NetNamespace

BRIDGE = "cni0"
NETWORK_NAME = "rocshare-realnode"
CNI_CACHE = Path("/var/lib/cni/results")  # libcni's cache, a host path containerd 1.6 does not let us move
BRIDGE_ADDRESS = "10.244.0.1"
POD_SUBNET = "10.244.0.0/24"


def kubernetes_service_ip(service_cidr: str) -> str:
    """The ClusterIP the API server gives the `kubernetes` Service: the range's first address."""
    return str(next(ipaddress.ip_network(service_cidr).hosts()))


def conflist(service_cidr: str, *, ipam_dir: Path) -> dict:
    return {
        "cniVersion": "0.4.0",
        "name": NETWORK_NAME,
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False, "hairpinMode": True,
             # host-local keeps its leases in /var/lib/cni by default, across runs: ours go with the run.
             "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                      "ranges": [[{"subnet": POD_SUBNET, "gateway": BRIDGE_ADDRESS}]],
                      "routes": [{"dst": service_cidr, "gw": BRIDGE_ADDRESS}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _dnat_rule(service_ip: str, apiserver_port: int) -> list[str]:
    return ["PREROUTING", "-i", BRIDGE, "-d", f"{service_ip}/32", "-p", "tcp", "--dport", "443",
            "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}"]


def set_up(ns: NetNamespace, *, cni_conf_dir: Path, service_cidr: str, apiserver_port: int) -> None:
    ns.run("ip", "link", "add", BRIDGE, "type", "bridge")
    ns.run("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
    ns.run("ip", "link", "set", BRIDGE, "up")
    ns.run("sysctl", "-q", "-w", f"net.ipv4.conf.{BRIDGE}.route_localnet=1")
    ns.run("iptables", "-t", "nat", "-A", *_dnat_rule(kubernetes_service_ip(service_cidr), apiserver_port))
    cni_conf_dir.mkdir(parents=True, exist_ok=True)
    config = conflist(service_cidr, ipam_dir=cni_conf_dir.parent / "cni-ipam")
    (cni_conf_dir / "10-rocshare-realnode.conflist").write_text(json.dumps(config, indent=2))


# The chains the kubelet adds (real-node.md, trap 3), in the tables it adds them to.
KUBELET_CHAINS = (("filter", "KUBE-FIREWALL"), ("filter", "KUBE-KUBELET-CANARY"), ("nat", "KUBE-KUBELET-CANARY"),
                  ("mangle", "KUBE-KUBELET-CANARY"), ("mangle", "KUBE-IPTABLES-HINT"))


def tear_down(ns: NetNamespace, *, service_cidr: str, apiserver_port: int) -> None:
    """Remove our rule and the kubelet's chains (the namespace's deletion would drop them too,
    but a rig kept for debugging must not keep stale rules)."""
    if not ns.exists():
        return
    ns.run("iptables", "-t", "nat", "-D", *_dnat_rule(kubernetes_service_ip(service_cidr), apiserver_port), check=False)
    for tool in ("iptables", "ip6tables"):
        for table, chain in KUBELET_CHAINS:
            for builtin in ("INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"):
                ns.run(tool, "-t", table, "-D", builtin, "-j", chain, check=False)
            ns.run(tool, "-t", table, "-F", chain, check=False)
            ns.run(tool, "-t", table, "-X", chain, check=False)
    ns.run("ip", "link", "delete", BRIDGE, check=False)


def remove_cni_cache() -> list[Path]:
    """Drop libcni's cached results of our pods' interfaces (`<network>-<sandbox>-eth0` and the
    same sandbox's `cni-loopback-<sandbox>-lo`), then the cache folders if nothing else is left."""
    if not CNI_CACHE.is_dir():
        return []
    sandboxes = {path.name[len(NETWORK_NAME) + 1:].rsplit("-", 1)[0] for path in CNI_CACHE.glob(f"{NETWORK_NAME}-*")}
    removed = [path for path in CNI_CACHE.iterdir() if path.name.startswith(f"{NETWORK_NAME}-")
               or any(path.name == f"cni-loopback-{sandbox}-lo" for sandbox in sandboxes)]
    for path in removed:
        path.unlink(missing_ok=True)
    for folder in (CNI_CACHE, CNI_CACHE.parent):
        try:
            folder.rmdir()
        except OSError:
            break
    return removed
