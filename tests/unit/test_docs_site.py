"""The documentation site builds strictly (what `make docs` does, into a temp folder), so a broken
link, a missing anchor or a page left out of the navigation fails `make test` — the CI gate. And
README.md, which GitHub shows outside the site, links only to files that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly(tmp_path) -> None:
    built = _build(tmp_path / "site")
    assert built.returncode == 0, built.stderr[-4000:]
    for page in ("troubleshooting", "install", "requesting-gpus", "reference/crds", "reference/metrics"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_a_broken_link_fails_the_build(tmp_path) -> None:
    """The strict gate is real: the same configuration on a copy of docs/ with one bad link fails."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(docs)], check=True)
    (docs / "troubleshooting.md").write_text((docs / "troubleshooting.md").read_text() + "\n[gone](no-such-page.md)\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    built = _build(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert built.returncode != 0 and "no-such-page.md" in built.stderr


def test_every_page_is_in_the_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav):
        for item in nav:
            for value in item.values():
                yield from pages(value) if isinstance(value, list) else [value]

    in_nav = set(pages(config["nav"]))
    on_disk = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    assert on_disk == in_nav, f"not in nav: {on_disk - in_nav}; in nav, no file: {in_nav - on_disk}"


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", text)
               if not re.match(r"^[a-z]+://", target) and not target.startswith("#")]
    assert targets
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_readme_is_a_five_minute_read_that_leads_to_the_docs() -> None:
    """Issue 33: at most ~150 lines, and from it alone a newcomer finds how to install, how to ask
    for a slice and where a Pending pod is explained."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    for needed in ("helm install rocshare charts/rocshare", "kubectl apply --server-side -k manifests/overlays/",
                   "amd.com/gpumem", "amd.com/gpumem-percentage", "amd.com/gpucores",
                   "kubectl get amdgpunodes,amdgpupools,amdgpushares", "docs/troubleshooting.md",
                   "docs/benchmarks.md", "make demo", "make test"):
        assert needed in text, needed
