"""The inventory loop reads sysfs again only when it may have changed (inventory_loop.py,
REDISCOVER_S): on the first check, when the pool's sharing settings change and at least every
REDISCOVER_S; device-file health is checked on every pass, so a lost device and one that comes
back show at once. On a real capture (../shared/fixtures/sysfs), with a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocshare.api.models import OperatingMode, Sharing
from rocshare_agent import inventory_loop
from rocshare_agent.inventory_loop import REDISCOVER_S, InventoryAgent
from tests.agent_fakes import RecordingKube

CAPTURE = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures" / "sysfs" / "mi210-8gpu-xgmi"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    (tmp_path / "dri").mkdir()
    (tmp_path / "kfd").write_text("")
    for minor in range(128, 136):
        (tmp_path / "dri" / f"renderD{minor}").write_text("")
    return tmp_path


async def test_sysfs_is_read_again_only_when_it_may_have_changed(dev_root: Path, monkeypatch) -> None:
    reads = []
    real = inventory_loop.discover
    monkeypatch.setattr(inventory_loop, "discover", lambda *args, **kwargs: reads.append(kwargs) or real(*args, **kwargs))
    clock = Clock()
    agent = InventoryAgent(RecordingKube("n"), node_name="n", sysfs_root=CAPTURE, dev_root=dev_root, clock=clock)
    await agent.check()
    assert len(reads) == 1 and len(agent.gpus) == 8 and all(gpu.healthy for gpu in agent.gpus)

    (dev_root / "dri" / "renderD130").unlink()  # a device lost: seen on the next pass, no sysfs read
    clock.now += 2
    await agent.check()
    assert len(reads) == 1 and [gpu.render_minor for gpu in agent.gpus if not gpu.healthy] == [130]
    (dev_root / "dri" / "renderD130").write_text("")  # and back
    clock.now += 2
    await agent.check()
    assert len(reads) == 1 and all(gpu.healthy for gpu in agent.gpus)

    clock.now += REDISCOVER_S
    await agent.check()
    assert len(reads) == 2
    agent.settings = agent.settings.model_copy(update={"sharing": Sharing(split_count=4)})
    agent._settings_at = clock.now  # the settings just read (no Node read in this test)
    await agent.check()
    assert len(reads) == 3 and reads[-1]["split_count"] == 4 and {gpu.split_count for gpu in agent.gpus} == {4}
    agent.settings = agent.settings.model_copy(update={"sharing": Sharing(split_count=4,
                                                                          operating_mode=OperatingMode.CU)})
    await agent.check()
    assert len(reads) == 3  # the same settings: nothing to read again
