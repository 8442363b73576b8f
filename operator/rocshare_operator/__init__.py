"""The rocshare operator: one process, five rooms.

* ``reconcilers/`` — the AmdGpuPool loops (node marks, the node-agent DaemonSet, status, the
  finalizer; run from the feed's pool watch) and the AmdGpuShare loops (Kopf daemons:
  ResourceQuotas, status), Kopf's login, and the wake-ups that tie events to reconcile loops.
  ``kopf_app`` is the process.
* ``status/`` — pure: what a pool's and a share's status say, which node a pool owns, what pods
  hold, and the conditions' transition rules. No I/O.
* ``feed/`` — the one watch per kind (Nodes, Pods, AmdGpuNodes, ResourceQuotas, AmdGpuPools)
  for the whole process, and the
  small frozen facts it decodes from each object for every reader.
* ``extender/`` — the scheduler extender: filter, prioritize, bind (the one place a decision
  becomes real), its caches, quota check and metrics.
* ``admission/`` — the pod admission webhook: the pure rules (``pods``) and their Kopf wiring.

At the top: ``cli`` (`rocshare operator`), ``context`` (what every handler shares),
``scheduling`` (wires the extender and the webhook beside Kopf) and ``retrying``.
"""
