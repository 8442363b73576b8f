"""`kubectl rocshare`: the kubectl plugin shipped with rocshare (console script `kubectl-rocshare`).

    kubectl rocshare resize pod/<name> [--gpumem MIB] [--gpucores PCT] [--container NAME]
                                       [-n NAMESPACE] [--wait SECONDS]

`resize` writes a resize request (rocshare.api.resize, annotation ``rocshare.io/resize``) on a running
pod, with a generation above every earlier one, under the pod's resourceVersion; the operator's
leader decides it and answers with the pod condition ``rocshare.io/Resized``. The plugin waits for
that answer (``--wait 0``: it does not) and says what it was. Input is checked before anything is
written, and each problem is named. It needs only what a tenant has: `edit` in the namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, decode_record
from rocshare.api.resize import (
    MEMORY_MIB_MAX, RESIZE_ANNOTATION, RESIZED_CONDITION, ResizeRequest, answers, encode_request, request_generation,
)
from rocshare.kube.client import ApiError, Conflict, Kube, NotFound, object_path

POLL_S = 0.5
PATCH_ATTEMPTS = 3


class UsageError(ValueError):
    """Input the plugin refuses before writing anything; the message names the problem."""


def _mib(text: str) -> int:
    return _whole(text, "--gpumem", "MiB per GPU (e.g. 8192 for 8 GiB)", 1, MEMORY_MIB_MAX)


def _pct(text: str) -> int:
    return _whole(text, "--gpucores", "percent of each GPU's compute units", 1, 100)


def _whole(text: str, flag: str, unit: str, low: int, high: int) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} is in {unit}: '{text}' is not a whole number") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{flag} is in {unit}: {value} is out of range {low}-{high}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubectl rocshare", description=__doc__.split("\n\n")[0].strip())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    resize = commands.add_parser("resize", help="resize a running pod's GPU slice without restarting it",
                                 description=__doc__.split("\n\n")[2].strip())
    resize.add_argument("target", help="pod/<name> (or just <name>)")
    resize.add_argument("--gpumem", type=_mib, help="the new amd.com/gpumem, MiB per GPU")
    resize.add_argument("--gpucores", type=_pct, help="the new amd.com/gpucores, percent of each GPU's CUs (1-100)")
    resize.add_argument("-c", "--container", help="the container to resize (needed when several hold slices)")
    resize.add_argument("-n", "--namespace", help="the pod's namespace (default: the kubeconfig context's)")
    resize.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    resize.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for the operator's answer (0: do not wait; default 60)")
    return parser


def pod_name(target: str) -> str:
    """The pod's name from `pod/<name>`, `pods/<name>` or `<name>`."""
    kind, slash, name = target.partition("/")
    if not slash:
        kind, name = "pod", target
    if kind not in ("pod", "pods", "po"):
        raise UsageError(f"only pods can be resized, not '{kind}' ('{target}')")
    if not name:
        raise UsageError(f"'{target}' names no pod")
    return name


def next_request(pod: dict, *, memory_mib: int | None, cores_pct: int | None, container: str | None) -> ResizeRequest:
    """The request to write on this pod: a generation above the pod's last request and its record's."""
    annotations = pod["metadata"].get("annotations") or {}
    record_text = annotations.get(ALLOCATION_ANNOTATION)
    if record_text is None:
        raise UsageError(f"pod {pod['metadata']['name']} holds no rocshare GPU slice (it has no "
                         f"{ALLOCATION_ANNOTATION}: not bound yet, a DRA claim, or no amd.com/* limits)")
    try:
        applied = decode_record(record_text).generation
    except AllocationError as error:
        raise UsageError(f"pod {pod['metadata']['name']}: {error}") from None
    generation = max(applied, request_generation(annotations.get(RESIZE_ANNOTATION))) + 1
    return ResizeRequest(generation=generation, container=container, memory_mib=memory_mib, cores_pct=cores_pct)


def outcome(pod: dict, generation: int) -> tuple[bool, str] | None:
    """(applied, message) once the operator answered that generation; None while it has not."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == RESIZED_CONDITION and answers(condition.get("message") or "", generation):
            return condition.get("status") == "True", f"{condition.get('reason')}: {condition.get('message')}"
    return None


async def resize(kube: Kube, namespace: str, name: str, args: argparse.Namespace) -> int:
    path = object_path("v1", "pods", name, namespace=namespace)
    for attempt in range(1, PATCH_ATTEMPTS + 1):
        try:
            pod = await kube.get(path)
        except NotFound:
            raise UsageError(f"pod {namespace}/{name} not found") from None
        request = next_request(pod, memory_mib=args.gpumem, cores_pct=args.gpucores, container=args.container)
        patch = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"],
                              "annotations": {RESIZE_ANNOTATION: encode_request(request)}}}
        try:
            await kube.merge_patch(path, patch)
            break
        except Conflict:
            if attempt == PATCH_ATTEMPTS:
                raise
    print(f"pod/{name}: resize generation {request.generation} requested")
    return await _wait(kube, path, name, request.generation, args.wait)


async def _wait(kube: Kube, path: str, name: str, generation: int, wait_s: float) -> int:
    if wait_s <= 0:
        return 0
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        answered = outcome(await kube.get(path), generation)
        if answered is not None:
            applied, message = answered
            print(f"pod/{name}: {message}")
            return 0 if applied else 1
        await asyncio.sleep(POLL_S)
    print(f"pod/{name}: no answer from the rocshare operator in {wait_s:g} s; watch the pod's "
          f"{RESIZED_CONDITION} condition", file=sys.stderr)
    return 2


def _context_namespace(kubeconfig: str | None) -> str:
    from kubernetes_asyncio import config  # the adapter's library; imported here to keep --help fast

    try:
        _contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError, TypeError):
        return "default"
    return ((active or {}).get("context") or {}).get("namespace") or "default"


async def _run(args: argparse.Namespace) -> int:
    name = pod_name(args.target)
    if args.gpumem is None and args.gpucores is None:
        raise UsageError("say what to change: --gpumem MIB, --gpucores PCT, or both")
    namespace = args.namespace or _context_namespace(args.kubeconfig)
    async with await Kube.connect(args.kubeconfig) as kube:
        return await resize(kube, namespace, name, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except UsageError as error:
        parser.exit(2, f"kubectl rocshare: error: {error}\n")
    except ApiError as error:
        parser.exit(1, f"kubectl rocshare: the API server refused: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
