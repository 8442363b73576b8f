"""Retries for API calls: temporary errors (409 conflicts, 429, 5xx, an unreachable
server) are retried after each delay of a backoff list, every attempt logged with
its number; permanent errors (403, 422, ...) are raised at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from rocshare.kube.client import ApiError

T = TypeVar("T")
BACKOFFS_S: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)


async def with_retries(what: str, call: Callable[[], Awaitable[T]], *, logger: logging.Logger | logging.LoggerAdapter,
                       backoffs_s: Sequence[float] = BACKOFFS_S) -> T:
    delays = [*backoffs_s, None]
    for attempt, delay_s in enumerate(delays, start=1):
        try:
            return await call()
        except ApiError as error:
            if not error.temporary or delay_s is None:
                raise
            logger.warning(f"{what}: attempt {attempt} failed ({error}); retrying in {delay_s}s")
            await asyncio.sleep(delay_s)
    raise AssertionError("unreachable")
