"""The pure core: request parsing, node model, ledger, fit, CU masks, policies, allocation.

No Kubernetes, gRPC, HTTP, Kopf, files, clocks or mutable globals (an import-linter contract
in pyproject.toml keeps it so). Callers own every cache: the ledger, memo objects.
Entry points: request.parse_pod, inventory.NodeInventory.from_gpu_infos, ledger.Ledger,
allocate.plan_pod (filter/prioritize), allocate.allocate (bind), quota.check_quota,
policies.normalize_scores, cumask.render_hsa_cu_mask.
"""
