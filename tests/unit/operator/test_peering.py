"""Kopf peering owned by the operator (leadership.py): an identity that never asks for
a user name (uid 65532 has no passwd entry in the image), and the peering object made at start."""

from __future__ import annotations

import datetime
import getpass

import pytest

from rocshare.kube.client import Conflict, NotFound
from rocshare_operator import leadership as peering

STARTED = datetime.datetime(2026, 12, 1, 15, 0, 7, tzinfo=datetime.UTC)


def test_identity_is_the_pod_name_from_the_downward_api() -> None:
    assert peering.own_identity({"POD_NAME": "rocshare-operator-5d9f-abcde"}, hostname="h", pid=1,
                                started=STARTED) == "rocshare-operator-5d9f-abcde"
    assert peering.own_identity({"POD_ID": "kopf-style"}, hostname="h", pid=1, started=STARTED) == "kopf-style"


def test_identity_outside_a_pod_needs_no_user_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_passwd_entry() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setattr(getpass, "getuser", no_passwd_entry)
    assert peering.own_identity({}, hostname="node-1", pid=42, started=STARTED) == \
        "rocshare-operator@node-1/42/20261201150007"
    assert peering.this_process_identity()


class Peerings:
    def __init__(self, existing: bool = False, race: bool = False) -> None:
        self.existing, self.race, self.created = existing, race, []

    async def get(self, path: str) -> dict:
        if not self.existing:
            raise NotFound(404, "NotFound", path)
        return {}

    async def create(self, path: str, body: dict) -> dict:
        if self.race:
            raise Conflict(409, "AlreadyExists", path)
        self.created.append((path, body["metadata"]["name"]))
        return body


async def test_peering_object_is_created_when_missing_and_left_alone_otherwise() -> None:
    missing, present, raced = Peerings(), Peerings(existing=True), Peerings(race=True)
    for kube in (missing, present, raced):
        await peering.ensure_peering_object(kube)
    assert missing.created == [("/apis/kopf.dev/v1/clusterkopfpeerings", "rocshare")]
    assert present.created == [] and raced.created == []
