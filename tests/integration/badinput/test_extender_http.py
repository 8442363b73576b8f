"""Bad requests to the extender's HTTP service (its aiohttp app on a local port, with a state fed
by hand and an API client that knows no pods): malformed JSON, wrong shapes, unknown pods and
nodes, unknown verbs, oversized bodies. Every answer is JSON with a non-empty `Error` saying
why (400/404/413 for a bad request, 200 with Error for a refused bind), and the service keeps
answering good requests afterwards."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web

from rocshare.kube.client import NotFound
from rocshare_operator.extender.binder import Binder
from rocshare_operator.extender.metrics import ExtenderMetrics
from rocshare_operator.extender.server import MAX_BODY_BYTES, ExtenderService, make_app
from rocshare_operator.extender.state import SchedulerState


class NoPods:
    async def get(self, path: str) -> dict:
        raise NotFound(404, "NotFound", f"{path} not found")


def gpu(index: int) -> dict:
    return {"id": f"GPU-{index}", "index": index, "gfxTargetVersion": 90010, "cuCount": 104, "vramMiB": 65520,
            "pciBDF": f"0000:0{index}:00.0", "splitCount": 10, "healthy": True}


@pytest.fixture
async def post():
    state = SchedulerState()
    state.on_node("ADDED", {"metadata": {"name": "n1"}, "status": {"allocatable": {"amd.com/gpu": "10"}}})
    state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": {"gpus": [gpu(0)]}})
    service = ExtenderService(state, Binder(NoPods(), state, wait_timeout_s=1), ExtenderMetrics(state),
                              ready=lambda: True)
    runner = web.AppRunner(make_app(service))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/extender/"
    async with aiohttp.ClientSession() as session:
        async def send(verb: str, body: bytes | str | dict) -> tuple[int, dict]:
            data = json.dumps(body) if isinstance(body, dict | list) else body
            async with session.post(base + verb, data=data) as reply:
                text = await reply.text()
                return reply.status, json.loads(text) if reply.content_type == "application/json" else {"Error": text}
        yield send
    await runner.cleanup()


POD = {"metadata": {"name": "p", "namespace": "ns"},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "1024"}}}]}}


@pytest.mark.parametrize(("verb", "body", "status", "message"), [
    ("filter", b"{not json", 400, "not JSON"),
    ("filter", b"\xff\xfe\x00", 400, "not JSON"),
    ("filter", "[1, 2]", 400, "must be a JSON object"),
    ("filter", {"NodeNames": ["n1"]}, 400, "ExtenderArgs.Pod is missing"),
    ("filter", {"Pod": POD, "NodeNames": "n1"}, 400, "NodeNames must be a list"),
    ("filter", {"Pod": POD, "NodeNames": [1, 2]}, 400, "NodeNames must be a list"),
    ("prioritize", {"Pod": "p", "NodeNames": ["n1"]}, 400, "ExtenderArgs.Pod is missing"),
    ("bind", {"PodName": "p"}, 400, "ExtenderBindingArgs lacks"),
    ("bind", "null", 400, "must be a JSON object"),
    ("preempt", {"NodeNameToMetaVictims": {}}, 400, "ExtenderArgs.Pod is missing"),
    ("unreserve", {}, 404, "unknown extender verb 'unreserve'"),
], ids=["truncated", "binary", "array", "no pod", "names not a list", "names not strings", "pod not an object",
        "bind without node", "null", "preempt without pod", "unknown verb"])
async def test_malformed_requests_are_refused_with_why(post, verb, body, status, message) -> None:
    got_status, reply = await post(verb, body)
    assert got_status == status and message in reply["Error"], reply


async def test_bad_pod_values_are_a_filter_error_not_a_crash(post) -> None:
    pod = {**POD, "spec": {"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpucores": "250"}}}]}}
    status, reply = await post("filter", {"Pod": pod, "NodeNames": ["n1"]})
    assert status == 200 and "amd.com/gpucores is 250, must be 1-100" in reply["Error"] and reply["NodeNames"] == []


async def test_pod_with_a_wrongly_shaped_spec(post) -> None:
    pod = {**POD, "spec": {"containers": [{"name": "c", "resources": {"requests": 7}}]}}
    status, reply = await post("filter", {"Pod": pod, "NodeNames": ["n1"]})
    assert status == 200 and "requests must be an object, got int" in reply["Error"]


async def test_unknown_nodes_are_filtered_out_with_a_reason(post) -> None:
    status, reply = await post("filter", {"Pod": POD, "NodeNames": ["n1", "ghost"]})
    assert status == 200 and reply["NodeNames"] == ["n1"] and "NoGpuInventory" in reply["FailedNodes"]["ghost"]
    status, scores = await post("prioritize", {"Pod": POD, "NodeNames": ["ghost", "n1"]})
    assert status == 200 and [entry["Host"] for entry in scores] == ["ghost", "n1"] and scores[0]["Score"] == 0


async def test_bind_of_an_unknown_pod_is_refused_with_why(post) -> None:
    status, reply = await post("bind", {"PodName": "ghost", "PodNamespace": "ns", "PodUID": "u", "Node": "n1"})
    assert status == 200 and "cannot read the pod" in reply["Error"] and "not found" in reply["Error"]


async def test_oversized_body_is_refused(post) -> None:
    status, reply = await post("filter", b"{" + b" " * (MAX_BODY_BYTES + 10) + b"}")
    assert status == 413 and "Maximum request body size" in reply["Error"]


async def test_still_answers_after_the_garbage(post) -> None:
    for body in (b"{", b"[]", b"\x00"):
        await post("filter", body)
    status, reply = await post("filter", {"Pod": POD, "NodeNames": ["n1"]})
    assert status == 200 and reply["NodeNames"] == ["n1"] and reply["Error"] == ""
