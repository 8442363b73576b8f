"""Every reason rocshare can emit is in its catalogue (rocshare.api.reasons) and has an entry in
docs/troubleshooting.md.

The reasons are found by reading the product's code, not from the catalogue: every string that is
a scheduler filter reason (the `Reason` enum, a whole-node rejection `_whole(reason, ...)`, and the
reasons the extender's rejection counter is created with), an Event's reason (`reason=` of
kopf.warn, the agent's `warn(pod, reason, ...)`, the operator's `_post(key, reason, ...)`, a node
`Transition`), a condition's reason (`Condition(reason=...)`, `ConditionState(type, status, reason,
...)`, the Degraded issues' `(reason, message)` tuples), a `"reason": ...` dict entry or a module
constant named `*REASON*`; a module constant passed in any of those places counts as its value.
A reason added in any of those forms without a troubleshooting entry fails here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from rocshare.api import reasons
from rocshare.core.fit import Reason
from rocshare_operator.extender.decisions import BLOCKED, NO_INVENTORY
from rocshare_operator.extender.metrics import ExtenderMetrics
from rocshare_operator.extender.state import SchedulerState

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("src/rocshare", "operator/rocshare_operator", "nodeagent/rocshare_agent")
PAGE = ROOT / "docs" / "troubleshooting.md"
WORD = re.compile(r"^[A-Z][A-Za-z0-9]+$")
EMITTERS = {"warn": 1, "_post": 1, "Transition": 0, "ConditionState": 2, "_whole": 0, "whole_node": 0}
"""Callable name -> the position of its reason argument."""


def _text(node: ast.AST | None, constants: dict[str, str] | None = None) -> str | None:
    """A string literal's value, or a module constant's when `node` names one."""
    if isinstance(node, ast.Name) and constants:
        return constants.get(node.id)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _module_constants(tree: ast.Module) -> dict[str, str]:
    return {node.targets[0].id: node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _from_call(call: ast.Call, constants: dict[str, str]) -> Iterator[str | None]:
    yield from (_text(keyword.value, constants) for keyword in call.keywords if keyword.arg == "reason")
    position = EMITTERS.get(_called(call))
    if position is not None and len(call.args) > position:
        yield _text(call.args[position], constants)
    first = call.args[0] if call.args else None
    if _called(call) == "append" and isinstance(first, ast.Tuple) and first.elts:
        yield _text(first.elts[0], constants)


def _candidates(node: ast.AST, constants: dict[str, str]) -> Iterator[str | None]:
    if isinstance(node, ast.Call):
        yield from _from_call(node, constants)
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        if "REASON" in node.targets[0].id or node.targets[0].id in ("NO_INVENTORY", "BLOCKED"):
            yield _text(node.value)
    elif isinstance(node, ast.Dict):
        yield from (_text(value) for key, value in zip(node.keys, node.values) if _text(key) == "reason")
    elif isinstance(node, ast.ClassDef) and node.name == "Reason":
        yield from (_text(statement.value) for statement in node.body if isinstance(statement, ast.Assign))


def emitted_by_code() -> dict[str, set[str]]:
    """reason -> the files that emit it."""
    found: dict[str, set[str]] = {}
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            constants = _module_constants(tree)
            for node in ast.walk(tree):
                for word in _candidates(node, constants):
                    if word and WORD.match(word):
                        found.setdefault(word, set()).add(str(path.relative_to(ROOT)))
    return found


def documented() -> list[str]:
    """The `### \\`Reason\\`` headings under `## Reasons` of the troubleshooting page."""
    section = PAGE.read_text().split("\n## Reasons\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^### `([A-Za-z0-9]+)`$", section, flags=re.MULTILINE)


def test_the_code_reading_finds_the_known_emitters() -> None:
    """The reader is not vacuous: it finds reasons of each kind where they are written."""
    found = emitted_by_code()
    assert "src/rocshare/core/fit.py" in found["CardInsufficientMemory"]
    assert "nodeagent/rocshare_agent/hook.py" in found["MemoryHookMissing"]
    assert "nodeagent/rocshare_agent/publish.py" in found["AMDGPUUnhealthy"]
    assert "operator/rocshare_operator/status/pool_status.py" in found["NodesNotReporting"]
    assert "operator/rocshare_operator/reconcilers/pools.py" in found["NodeConflict"]
    assert "operator/rocshare_operator/extender/events.py" in found["UnaccountableAllocation"]
    assert "nodeagent/rocshare_agent/deviceplugin/service.py" in found["NoMemoryLimit"]
    assert len(found) >= 40


def test_the_catalogue_holds_exactly_what_the_code_emits() -> None:
    found = emitted_by_code()
    missing = {word: sorted(files) for word, files in found.items() if word not in reasons.ALL}
    stale = sorted(set(reasons.ALL) - set(found))
    assert not missing, f"emitted but not in src/rocshare/api/reasons.py: {missing}"
    assert not stale, f"in the catalogue but emitted nowhere: {stale}"


def test_filter_reasons_are_the_extenders() -> None:
    """The filter reasons are the fit reasons and the extender's whole-node ones, and exactly the
    reasons its rejection counter is created with (every one it can count)."""
    counted = {sample.labels["reason"] for family in ExtenderMetrics(SchedulerState()).registry.collect()
               if family.name == "rocshare_extender_node_rejections" for sample in family.samples
               if "reason" in sample.labels}
    assert {reason.value for reason in Reason} | {NO_INVENTORY, BLOCKED} <= counted
    assert {reason.name for reason in reasons.FILTER_REASONS} == counted


def test_every_reason_has_a_troubleshooting_entry() -> None:
    headings = documented()
    assert len(headings) == len(set(headings)), "a reason has two entries"
    missing, stray = set(reasons.ALL) - set(headings), set(headings) - set(reasons.ALL)
    assert not missing, f"no entry in docs/troubleshooting.md: {missing}"
    assert not stray, f"entries for reasons rocshare never emits: {stray}"


def test_entries_say_what_to_do() -> None:
    """An entry for a problem says where it appears and what to do; a healthy one says it is healthy."""
    text = PAGE.read_text().split("\n## Reasons\n", 1)[1]
    for name, reason in reasons.ALL.items():
        entry = text.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        if reason.healthy:
            assert entry.lstrip().startswith("*Healthy.*"), name
        else:
            assert "Where:" in entry and "Do:" in entry, f"{name}: no 'Where:' or 'Do:'"
