"""Reconcilers: AmdGpuPool loops (node marks, node-agent DaemonSet, status, the finalizer; run
from the cluster feed's pool watch, pool_loops.py) and AmdGpuShare loops (ResourceQuota, status;
Kopf daemons), Kopf's login, and the wake-ups that link cluster events to those loops. All
writes to pools, shares, nodes, DaemonSets and quotas happen here; what to write is decided in
``rocshare_operator.status`` (pure)."""
