"""Kopf reconcilers: AmdGpuPool (node marks, node-agent DaemonSet, status) and AmdGpuShare
(ResourceQuota, status) loops, the Kopf indexes and login, and the wake-ups that link cluster
events to those loops. All writes to pools, shares, nodes, DaemonSets and quotas happen here;
what to write is decided in ``rocshare_operator.status`` (pure)."""
