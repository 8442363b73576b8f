"""rocshare's development harness: everything that tests and measures the product, and none
of what ships. `rocshare-dev bench <name>` runs a benchmark, `rocshare-dev cluster up|down`
the local control plane, `rocshare-dev demo up|down` the demo. The product never imports
this package (import-linter contract in pyproject.toml)."""
