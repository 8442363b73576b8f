"""The AMD Device Metrics Exporter speaking garbage or not speaking at all (a real local aiohttp
server, and a TCP listener that never answers): every poll returns within its timeout with an
error saying what was wrong, no verdicts are invented, and a good reply afterwards is read."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from rocshare_agent.health import ExporterHealth

GOOD = 'amd_gpu_health{gpu_id="0"} 1\n'


@pytest.fixture
async def exporter():
    state = {"body": GOOD, "status": 200, "delay_s": 0.0, "type": "text/plain"}

    async def metrics(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(state["delay_s"])
        body = state["body"]
        return web.Response(body=body if isinstance(body, bytes) else body.encode(), status=state["status"],
                            content_type=state["type"])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/metrics", state
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("body", "status", "message"), [
    ("<html><body>502 Bad Gateway</body></html>", 200, "not Prometheus text"),
    (b"\x00\xff\xfe\x89PNG\r\n", 200, "not Prometheus text"),
    ('gpu_health{gpu_id="0"} healthy\n', 200, "not Prometheus text"),
    ('gpu_temperature{gpu_id="0"} 41\n', 200, "no gpu_health samples"),
    ("gpu_health 1\n", 200, "no gpu_health samples with a gpu_id label"),
    ("", 200, "no gpu_health samples"),
    (GOOD, 500, "answered HTTP 500"),
    (GOOD, 404, "answered HTTP 404"),
], ids=["html", "binary", "word value", "other metric", "no label", "empty", "http 500", "http 404"])
async def test_garbage_is_reported_and_invents_nothing(exporter, body, status, message) -> None:
    url, state = exporter
    state.update(body=body, status=status)
    reading = await ExporterHealth(url).poll()
    assert message in reading.error and reading.verdicts == [], reading


async def test_an_exporter_that_hangs_times_out(exporter) -> None:
    url, state = exporter
    state["delay_s"] = 1.2
    started = time.monotonic()
    reading = await ExporterHealth(url, timeout_s=0.3).poll()
    assert time.monotonic() - started < 1.0 and "TimeoutError" in reading.error


async def test_a_listener_that_never_answers_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        reading = await ExporterHealth(f"http://127.0.0.1:{silent.getsockname()[1]}/metrics", timeout_s=0.3).poll()
    assert time.monotonic() - started < 1.0 and "unreachable" in reading.error


async def test_nothing_listening() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reading = await ExporterHealth(f"http://127.0.0.1:{port}/metrics", timeout_s=0.5).poll()
    assert "unreachable" in reading.error and reading.verdicts == []


async def test_a_good_reply_after_garbage_is_read(exporter) -> None:
    url, state = exporter
    health = ExporterHealth(url)
    state["body"] = "garbage {{{"
    assert (await health.poll()).error
    state["body"] = GOOD
    reading = await health.poll()
    assert reading.error is None and [v.healthy for v in reading.verdicts] == [True]
