"""ExporterHealth against a real local aiohttp server speaking exporter text, and slow,
dead and garbage-speaking ones: each poll stays within its timeout, the failure is reported,
last-known verdicts are kept until they go stale, then device-file health alone applies."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from rocshare_agent.health import ExporterHealth

HEALTHY_1_SICK = 'amd_gpu_health{gpu_id="0"} 1\namd_gpu_health{gpu_id="1"} 0\n'


@pytest.fixture
async def exporter():
    state = {"body": HEALTHY_1_SICK, "delay_s": 0.0, "status": 200}

    async def metrics(request: web.Request) -> web.Response:
        await asyncio.sleep(state["delay_s"])
        return web.Response(text=state["body"], status=state["status"], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/metrics", state
    finally:
        await runner.cleanup()


async def test_good_exporter(exporter):
    url, _ = exporter
    reading = await ExporterHealth(url).poll()
    assert reading.error is None and [v.healthy for v in reading.verdicts] == [True, False]


async def test_slow_exporter_times_out_and_keeps_last_known(exporter):
    url, state = exporter
    now = [0.0]
    health = ExporterHealth(url, timeout_s=0.3, stale_after_s=60, clock=lambda: now[0])
    await health.poll()
    state["delay_s"] = 1.5  # well past the 0.3 s timeout; short so teardown need not wait long
    started = time.monotonic()
    reading = await health.poll()
    assert time.monotonic() - started < 1.0
    assert "TimeoutError" in reading.error and reading.stale
    assert [v.healthy for v in reading.verdicts] == [True, False]  # last known, still fresh
    now[0] = 61.0
    assert (await health.poll()).verdicts == []  # stale: device files alone decide


async def test_garbage_and_http_errors_are_reported(exporter):
    url, state = exporter
    health = ExporterHealth(url, timeout_s=1.0)
    state["body"] = "<html>\x00\x01 not metrics {{{"
    assert "not Prometheus text" in (await health.poll()).error
    state["body"], state["status"] = HEALTHY_1_SICK, 500
    assert "HTTP 500" in (await health.poll()).error


async def test_dead_exporter(unused_tcp_port):
    reading = await ExporterHealth(f"http://127.0.0.1:{unused_tcp_port}/metrics", timeout_s=0.5).poll()
    assert "unreachable" in reading.error and reading.verdicts == []
