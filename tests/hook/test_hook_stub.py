"""The hook loaded by the real dynamic loader (LD_AUDIT) into programs using the stub ROCm runtime:
every entry point at and past the slice, what memory-info reports, several processes sharing one
account, a SIGKILLed process's memory coming back, forked children, CU mask narrowing, Python
through ctypes. Expected values are worked out here from the limit the test sets; the stub
alone does not enforce any slice (test_stub_alone_enforces_nothing), so each check fails without
the hook."""

from __future__ import annotations

import json
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from tests.hook.conftest import MIB, HookBuild

LIMIT_MIB = 1024
ENTRY_POINTS = [
    "hipMalloc", "hipExtMallocWithFlags", "hipMallocManaged", "hipMallocAsync", "hipMallocFromPoolAsync",
    "hipMallocPitch", "hipMemAllocPitch", "hipMalloc3D", "hipMallocArray", "hipMalloc3DArray",
    "hipArrayCreate", "hipArray3DCreate", "hipMallocMipmappedArray", "hipMipmappedArrayCreate", "hipMemCreate",
]


def _slice_env(hook_build: HookBuild, tmp_path, hooked=True, **extra):
    return hook_build.env(tmp_path, hooked, HIP_DEVICE_MEMORY_LIMIT_0=f"{LIMIT_MIB}m", **extra)


def test_stub_alone_enforces_nothing(hook_build: HookBuild, tmp_path):
    result = hook_build.probe_json(_slice_env(hook_build, tmp_path, hooked=False))
    assert result["memGetInfo"]["total"] == 16384 * MIB
    assert {result[e]["past_limit"] for e in ENTRY_POINTS} == {"hipSuccess"}


def _mipmap_bytes(limit: int) -> int:
    """What the probe's 2-level mipmap of 1-byte texels for `limit` takes: a W x 2048 base level
    and a W/2 x 1024 second level, W the largest that keeps the sum within the limit."""
    width = limit * 4 // 5 // 2048
    return width * 2048 + (width // 2) * 1024


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_stops_at_the_slice(hook_build: HookBuild, tmp_path, entry):
    result = hook_build.probe_json(_slice_env(hook_build, tmp_path))
    limit = LIMIT_MIB * MIB
    held = _mipmap_bytes(limit) if "Mipmapped" in entry else limit  # mipmap levels cannot sum to 1 GiB
    assert result["limit"] == limit
    assert result[entry] == {
        "at_limit": "hipSuccess",
        "past_limit": "hipErrorOutOfMemory",
        "free_while_held": limit - held,
        "free": "hipSuccess",
        "free_after": limit,
    }


def test_memory_info_reports_the_slice(hook_build: HookBuild, tmp_path):
    result = hook_build.probe_json(_slice_env(hook_build, tmp_path))
    limit = LIMIT_MIB * MIB
    assert result["memGetInfo"] == {"result": "hipSuccess", "free": limit, "total": limit}
    assert result["totalGlobalMem"]["bytes"] == limit
    assert result["totalGlobalMemR0000"]["bytes"] == limit  # ROCm 6's name for the 5.x layout
    assert result["totalGlobalMemR0600"]["bytes"] == limit  # what ROCm 6 builds of PyTorch call
    assert result["deviceTotalMem"]["bytes"] == limit
    assert result["attributeTotalGlobalMem"]["value"] == limit


def test_host_memory_and_runtime_errors_pass_through(hook_build: HookBuild, tmp_path):
    result = hook_build.probe_json(_slice_env(hook_build, tmp_path))
    assert result["hipHostMalloc_twice_limit"] == "hipSuccess"
    assert result["hipFree_bogus"] == "hipErrorInvalidValue"
    assert result["hipSetDevice_99"] == "hipErrorInvalidDevice"


def test_no_limit_means_no_change(hook_build: HookBuild, tmp_path):
    hooked = hook_build.probe_json(hook_build.env(tmp_path))
    bare = hook_build.probe_json(hook_build.env(tmp_path, hooked=False))
    assert hooked == bare


def test_cu_mask_is_narrowed_to_the_slice(hook_build: HookBuild, tmp_path):
    # a queue asking for every CU of a 104-CU GPU gets the slice's 0-25 and 78-103 only
    env = _slice_env(hook_build, tmp_path, HSA_CU_MASK="0:0-25,78-103", ROCM_STUB_CUS="104")
    assert hook_build.probe_json(env)["cu_mask"] == {"result": "hipSuccess", "cus": [*range(26), *range(78, 104)]}
    bare = hook_build.probe_json(_slice_env(hook_build, tmp_path, hooked=False, HSA_CU_MASK="0:0-25"))
    assert bare["cu_mask"]["cus"] == list(range(256))  # the stub alone trusts the caller


class Holder:
    """hook-probe holding one allocation until closed or killed."""

    def __init__(self, hook_build: HookBuild, env, mib: int):
        self.proc = subprocess.Popen(
            [str(hook_build.probe), "alloc", str(mib * MIB)], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )
        self.result = json.loads(self.proc.stdout.readline())["result"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _alloc_once(hook_build: HookBuild, env, mib: int) -> str:
    """One hipMalloc of mib in a new process that frees and exits at once: its result."""
    holder = Holder(hook_build, env, mib)
    holder.close()
    return holder.result


def test_processes_of_one_container_share_one_account(hook_build: HookBuild, tmp_path):
    env = _slice_env(hook_build, tmp_path)
    holders = [Holder(hook_build, env, 300) for _ in range(3)]
    try:
        assert [h.result for h in holders] == ["hipSuccess"] * 3
        assert hook_build.probe_json(env, "info")["memGetInfo"]["free"] == (LIMIT_MIB - 900) * MIB
        assert _alloc_once(hook_build, env, 300) == "hipErrorOutOfMemory"
        holders[0].close()  # frees on exit: its 300 MiB come back
        assert hook_build.probe_json(env, "info")["memGetInfo"]["free"] == (LIMIT_MIB - 600) * MIB
    finally:
        for h in holders:
            if h.proc.poll() is None:
                h.close()


def test_a_killed_process_gives_its_memory_back(hook_build: HookBuild, tmp_path):
    env = _slice_env(hook_build, tmp_path)
    victim = Holder(hook_build, env, 1000)
    assert victim.result == "hipSuccess"
    assert _alloc_once(hook_build, env, 100) == "hipErrorOutOfMemory"
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=30)
    after = Holder(hook_build, env, 1000)
    try:
        assert after.result == "hipSuccess"
    finally:
        after.close()


def test_forked_child_has_its_own_slot_in_the_same_account(hook_build: HookBuild, tmp_path):
    result = hook_build.probe_json(_slice_env(hook_build, tmp_path), "fork", str(400 * MIB))
    assert result["parent"] == "hipSuccess"
    assert result["child"] == "hipSuccess"  # 400 + 400 <= 1024
    assert result["child_free"] == (LIMIT_MIB - 800) * MIB
    # the child also hipFree()s the parent's pointer (the stub's copied memory lets it): that must not
    # refund the parent's 400 MiB, and the exited child's own 400 MiB come back
    assert result["parent_free_after_child"] == (LIMIT_MIB - 400) * MIB


def test_python_through_ctypes(hook_build: HookBuild, tmp_path):
    script = textwrap.dedent(f"""
        import ctypes, json
        hip = ctypes.CDLL({str(hook_build.stub_dir / 'libamdhip64.so.5')!r})
        p = ctypes.c_void_p()
        at = hip.hipMalloc(ctypes.byref(p), ctypes.c_size_t({LIMIT_MIB * MIB}))
        q = ctypes.c_void_p()
        past = hip.hipMalloc(ctypes.byref(q), ctypes.c_size_t(1))
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        hip.hipMemGetInfo(ctypes.byref(free), ctypes.byref(total))
        print(json.dumps({{"at": at, "past": past, "free": free.value, "total": total.value,
                           "freed": hip.hipFree(p)}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], env=_slice_env(hook_build, tmp_path),
                         capture_output=True, text=True, timeout=60, check=True)
    hip_success, hip_error_out_of_memory = 0, 2  # hipError_t values in hip_runtime_api.h
    assert json.loads(out.stdout) == {"at": hip_success, "past": hip_error_out_of_memory, "free": 0,
                                      "total": LIMIT_MIB * MIB, "freed": hip_success}


def test_oversubscribed_slice_falls_back_to_managed_memory(hook_build: HookBuild, tmp_path):
    # deviceMemoryScaling 2: a 1024 MiB slice on a GPU that has only 512 MiB
    small_gpu = {"ROCM_STUB_VRAM_MIB": "512"}
    plain_env = _slice_env(hook_build, tmp_path, **small_gpu)
    over_env = _slice_env(hook_build, tmp_path, HIP_OVERSUBSCRIBE="true", **small_gpu)
    assert _alloc_once(hook_build, plain_env, 800) == "hipErrorOutOfMemory"  # the GPU's own refusal, passed through
    assert hook_build.probe_json(plain_env, "info")["memGetInfo"]["free"] == 512 * MIB
    assert hook_build.probe_json(over_env, "info")["memGetInfo"] == {"result": "hipSuccess", "free": LIMIT_MIB * MIB,
                                                                     "total": LIMIT_MIB * MIB}
    held = Holder(hook_build, over_env, 800)  # past the GPU, within the slice: managed memory
    try:
        assert held.result == "hipSuccess"
        assert _alloc_once(hook_build, over_env, 300) == "hipErrorOutOfMemory"  # past the slice
    finally:
        held.close()


def test_a_gpu_without_a_limit_is_untouched(hook_build: HookBuild, tmp_path):
    # a limit on GPU 1 only: everything the probe does on GPU 0 is as without the hook
    env = hook_build.env(tmp_path, ROCM_STUB_DEVICES="2", HIP_DEVICE_MEMORY_LIMIT_1="256m")
    bare = hook_build.probe_json(hook_build.env(tmp_path, hooked=False, ROCM_STUB_DEVICES="2"))
    assert hook_build.probe_json(env) == bare


def test_bind_now_bindings_are_wrapped_too(hook_build: HookBuild, tmp_path):
    # LD_BIND_NOW resolves every function at start instead of at first call (glibc >= 2.35 audits both)
    result = hook_build.probe_json(_slice_env(hook_build, tmp_path, LD_BIND_NOW="1"))
    assert result["hipMalloc"]["past_limit"] == "hipErrorOutOfMemory"
    assert result["memGetInfo"]["total"] == LIMIT_MIB * MIB


def test_a_refusal_is_said_on_stderr_and_noted_in_the_account(hook_build: HookBuild, tmp_path):
    """One line on stderr per refusal with the figures (asked, held, limit, GPU), and the same text
    left in the container's account file, where whoever inspects the container finds it."""
    env = _slice_env(hook_build, tmp_path)
    holder = Holder(hook_build, env, LIMIT_MIB)
    try:
        assert holder.result == "hipSuccess"
        out = subprocess.run([str(hook_build.probe), "alloc", str(MIB)], env=env, input="", capture_output=True,
                             text=True, timeout=60, check=True)
    finally:
        holder.close()
    limit = LIMIT_MIB * MIB
    assert json.loads(out.stdout)["result"] == "hipErrorOutOfMemory"
    said = (f"refused {MIB} bytes on GPU 0: past the slice (the container holds {limit} of its {limit}-byte limit)")
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and re.fullmatch(r"rocshare-hook\[\d+\]: " + re.escape(said), lines[0]), out.stderr
    [account] = tmp_path.glob("rocshare-hook-v3-*.acct")
    assert said.encode() in account.read_bytes()


GIB = 1024 * MIB


def _write_limits(slice_dir, generation: int, limit_bytes: int, cu_ranges: str | None = None) -> None:
    """The agent's way (docs/container-account.md, rocshare.api.container_account.limits_for): a whole
    new file, memory and, given `cu_ranges`, the cu-mask line, renamed over the old one."""
    cu_line = f"cu-mask 0 {cu_ranges}\n" if cu_ranges is not None else ""
    temporary = slice_dir / "limits.tmp"
    temporary.write_text(f"rocshare-limits 1\ngeneration {generation}\nmemory 0 {limit_bytes}\n{cu_line}")
    temporary.rename(slice_dir / "limits")


def _account_env(hook_build: HookBuild, tmp_path, **extra):
    """A slice container's environment with the agent's two folders (usage and slice), made here."""
    account, slice_dir = tmp_path / "account", tmp_path / "slice"
    account.mkdir()
    slice_dir.mkdir()
    env = hook_build.env(tmp_path, ROCSHARE_ACCOUNT_DIR=str(account), ROCSHARE_SLICE_DIR=str(slice_dir), **extra)
    return env, account, slice_dir


class LineProbe:
    """One running hook-probe process in `mode` that answers each line it reads with one JSON line."""

    mode = ""

    def __init__(self, hook_build: HookBuild, env):
        self.proc = subprocess.Popen([str(hook_build.probe), self.mode], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(f"{command}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> str:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        return self.proc.stderr.read()


class Server(LineProbe):
    """hook-probe serve: one running process that allocates on request and holds it all."""

    mode = "serve"

    def alloc(self, nbytes: int) -> dict:
        return self.ask(str(nbytes))

    def free(self) -> dict:
        return self.ask("free")


def test_a_limit_raised_in_the_slice_file_applies_without_a_restart(hook_build: HookBuild, tmp_path):
    """Issue 43: a process holding 3 GiB under a 4 GiB limit is refused at 5 GiB; after the agent
    rewrites the slice's limits file to 8 GiB, the same process (same pid, never restarted) gets
    to 5 GiB, and memory info follows."""
    env, account, slice_dir = _account_env(hook_build, tmp_path, HIP_DEVICE_MEMORY_LIMIT_0="4096m",
                                           ROCM_STUB_VRAM_MIB="16384")
    _write_limits(slice_dir, 1, 4 * GIB)
    server = Server(hook_build, env)
    try:
        assert server.alloc(3 * GIB)["result"] == "hipSuccess"
        refused = server.alloc(2 * GIB)
        pid = server.proc.pid
        assert refused == {"op": "alloc", "result": "hipErrorOutOfMemory", "free": 1 * GIB, "total": 4 * GIB,
                           "held": 3 * GIB, "pid": pid}
        _write_limits(slice_dir, 2, 8 * GIB)
        assert server.alloc(2 * GIB) == {"op": "alloc", "result": "hipSuccess", "free": 3 * GIB, "total": 8 * GIB,
                                         "held": 5 * GIB, "pid": pid}
    finally:
        stderr = server.close()
    assert server.proc.returncode == 0 and pid == server.proc.pid
    assert f"refused {2 * GIB} bytes on GPU 0: past the slice (the container holds {3 * GIB} of its {4 * GIB}" in stderr
    assert [p.name for p in account.iterdir()] == ["usage.v3.acct"]  # the account is in the agent's folder
    assert not list(tmp_path.glob("rocshare-hook-*.acct"))  # and not in $ROCSHARE_HOOK_DIR
    data = (account / "usage.v3.acct").read_bytes()
    assert len(data) == 37248
    assert struct.unpack_from("<Q", data, 37120)[0] == 5 * GIB  # peak on GPU 0 since the file was made


def test_a_limit_lowered_below_what_is_held_refuses_until_the_process_frees(hook_build: HookBuild, tmp_path):
    """Issue 43's shrink: the file lowered to 1 GiB while the process holds 3 GiB frees nothing (the
    process still holds 3 GiB by its own count); every new allocation is refused until the process has
    freed below the new limit, then one fits again."""
    env, account, slice_dir = _account_env(hook_build, tmp_path, HIP_DEVICE_MEMORY_LIMIT_0="4096m",
                                           ROCM_STUB_VRAM_MIB="16384")
    _write_limits(slice_dir, 1, 4 * GIB)
    server = Server(hook_build, env)
    try:
        assert [server.alloc(3 * GIB // 2)["result"] for _ in range(2)] == ["hipSuccess"] * 2
        _write_limits(slice_dir, 2, 1 * GIB)
        refused = server.alloc(MIB)
        assert (refused["result"], refused["held"], refused["total"]) == ("hipErrorOutOfMemory", 3 * GIB, 1 * GIB)
        assert server.free()["held"] == 3 * GIB // 2
        assert server.alloc(MIB)["result"] == "hipErrorOutOfMemory"  # 1.5 GiB held: still over 1 GiB
        assert server.free() == {"op": "free", "result": "hipSuccess", "free": 1 * GIB, "total": 1 * GIB, "held": 0,
                                 "pid": server.proc.pid}
        assert server.alloc(MIB)["result"] == "hipSuccess"
    finally:
        server.close()
    assert server.proc.returncode == 0


def test_the_container_cannot_raise_its_limit_without_the_slice_file(hook_build: HookBuild, tmp_path):
    """A tenant's process that removes or forges what it can write (the usage folder) gains nothing:
    the limit comes from the slice folder only, and with the slice folder's file gone every limited
    allocation is refused rather than falling back to a limit of the environment's."""
    env, account, slice_dir = _account_env(hook_build, tmp_path, HIP_DEVICE_MEMORY_LIMIT_0="8192m")
    (account / "limits").write_text("rocshare-limits 1\nmemory 0 17179869184\n")  # a forged one, ignored
    _write_limits(slice_dir, 1, 1 * GIB)
    server = Server(hook_build, env)
    try:
        assert server.alloc(1 * GIB)["result"] == "hipSuccess"
        assert server.alloc(1)["result"] == "hipErrorOutOfMemory"  # the file's 1 GiB, not the env's 8
        (slice_dir / "limits").unlink()
        assert server.alloc(1)["result"] == "hipErrorOutOfMemory"
    finally:
        stderr = server.close()
    assert "the slice's limits file is missing" in stderr


class Queues(LineProbe):
    """hook-probe queues: one running process that makes streams (ROCr queues), launches, allocates
    and reports every queue's CU mask, on request."""

    mode = "queues"


def _write_cu_limits(slice_dir, generation: int, cu_ranges: str) -> None:
    """The CU tests' file: their 4 GiB slice and `cu_ranges` on GPU 0."""
    _write_limits(slice_dir, generation, 4 * GIB, cu_ranges)


def _cu_env(hook_build: HookBuild, tmp_path):
    """A 26-CU slice container as the agent starts it, over a stub that follows ROCr's own rule:
    HSA_CU_MASK read once at start, every queue's mask ANDed with it."""
    env, _, slice_dir = _account_env(hook_build, tmp_path, HIP_DEVICE_MEMORY_LIMIT_0="4096m", HSA_CU_MASK="0:0-25",
                                     ROCM_STUB_CUS="104", ROCM_STUB_ROCR_MASKING="1")
    return env, slice_dir


def test_queues_made_before_and_after_a_cu_mask_change_end_with_the_new_mask(hook_build: HookBuild, tmp_path):
    """Issue 43: one running process (never restarted); the agent rewrites the slice's cu-mask line.
    Shrink 0-25 -> 0-11: the queue made before and the one made after both hold 0-11 (the change seen
    at the new queue). Grow back to 0-25: seen by a process that only launches kernels (the hook looks
    at most once a second there). Grow to 0-51: ROCr ANDs every queue's mask with HSA_CU_MASK as it
    read it at start, so this process keeps 0-25 and says so; a process started afterwards in the same
    container (same environment, HSA_CU_MASK=0:0-25) gets 0-51, because the hook hands ROCr the
    slice file's mask before ROCr reads it."""
    env, slice_dir = _cu_env(hook_build, tmp_path)
    _write_cu_limits(slice_dir, 1, "0-25")
    queues = Queues(hook_build, env)
    try:
        assert queues.ask("new") == {"result": "hipSuccess", "masks": [list(range(26))]}
        _write_cu_limits(slice_dir, 2, "0-11")
        assert queues.ask("new") == {"result": "hipSuccess", "masks": [list(range(12))] * 2}
        assert queues.ask("all 1")["masks"] == [list(range(12))] * 2  # its own ask stays in the slice
        _write_cu_limits(slice_dir, 3, "0-25")
        launches = 0
        while queues.ask("launch")["masks"] != [list(range(26))] * 2 and launches < 300:
            launches += 1
            time.sleep(0.01)
        assert queues.ask("masks")["masks"] == [list(range(26))] * 2, f"after {launches} launches"
        _write_cu_limits(slice_dir, 4, "0-51")
        assert queues.ask("new") == {"result": "hipSuccess", "masks": [list(range(26))] * 3}
        newcomer = hook_build.probe_json(env)  # a new process: its queue asks for every CU
        pid = queues.proc.pid
    finally:
        stderr = queues.close()
    assert queues.proc.returncode == 0 and pid == queues.proc.pid
    assert newcomer["cu_mask"] == {"result": "hipSuccess", "cus": list(range(52))}
    assert ("GPU 0's slice has 52 CUs now; this process's queues keep at most 26 of them, the CUs its runtime "
            "started with") in stderr


@pytest.mark.parametrize("content", [
    None,  # missing
    "rocshare-limits 1\nmemory 0 4294967296\ncu-mask 0 0-103x\n",
    "rocshare-limits 1\nmemory 0 4294967296\ncu-mask 0 0-11\ncu-mask 0 0-103\n",
    "rocshare-limits 1\nmemory 0 4294967296\ncu-mask 0 0-11\n" + "#" * 4096 + "\n",
])
def test_a_process_started_on_a_bad_cu_mask_gets_no_queue(hook_build: HookBuild, tmp_path, content):
    """A slice file the hook cannot use when a process starts (the environment's mask may be wider
    than the last resize): no queue on the masked GPU, said on stderr; never the environment's mask."""
    env, slice_dir = _cu_env(hook_build, tmp_path)
    if content is not None:
        (slice_dir / "limits").write_text(content)
    out = subprocess.run([str(hook_build.probe), "queues"], env=env, input="new\n", capture_output=True, text=True,
                         timeout=60)
    assert json.loads(out.stdout) == {"result": "hipErrorInvalidValue", "masks": []}
    assert re.search(r"refused a queue on GPU 0: the slice's limits file (is missing|has a malformed cu-mask line|"
                     r"has two cu-mask lines for one GPU|is larger than 4096 bytes)", out.stderr)
    _write_cu_limits(slice_dir, 2, "0-11")  # the agent's good file: queues again, on the file's CUs
    out = subprocess.run([str(hook_build.probe), "queues"], env=env, input="new\n", capture_output=True, text=True,
                         timeout=60)
    assert json.loads(out.stdout) == {"result": "hipSuccess", "masks": [list(range(12))]}


def test_hsa_cu_mask_skip_init_does_not_unmask_new_queues(hook_build: HookBuild, tmp_path):
    """ROCr skips HSA_CU_MASK at queue creation under HSA_CU_MASK_SKIP_INIT=1 (AqlQueue's constructor),
    a name a pod's env may set: the hook gives every queue it sees created the slice itself."""
    env, slice_dir = _cu_env(hook_build, tmp_path)
    env["HSA_CU_MASK_SKIP_INIT"] = "1"
    _write_cu_limits(slice_dir, 1, "0-25")
    out = subprocess.run([str(hook_build.probe), "queues"], env=env, input="new\n", capture_output=True, text=True,
                         timeout=60, check=True)
    assert json.loads(out.stdout) == {"result": "hipSuccess", "masks": [list(range(26))]}
    bare = {k: v for k, v in env.items() if k != "LD_AUDIT"}
    out = subprocess.run([str(hook_build.probe), "queues"], env=bare, input="new\n", capture_output=True, text=True,
                         timeout=60, check=True)
    assert json.loads(out.stdout)["masks"] == [list(range(104))]  # what ROCr alone gives it
