"""The hook beside Debian's REAL HIP runtime (libamdhip64.so.5, installed by
`make -C hook real-runtime`). There is no GPU here, so the runtime answers "no device": the hook
must neither crash nor hide that, and it must still sit on the runtime's bindings (an allocation
past the slice is refused by the hook before the runtime is asked)."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
import textwrap

from tests.hook.conftest import MIB, HookBuild

HIP_SUCCESS, HIP_ERROR_OUT_OF_MEMORY = 0, 2  # hipError_t values in hip_runtime_api.h

SCRIPT = textwrap.dedent("""
    import ctypes, json, sys
    hip = ctypes.CDLL("libamdhip64.so.5")
    count = ctypes.c_int(-1)
    count_rc = hip.hipGetDeviceCount(ctypes.byref(count))
    p = ctypes.c_void_p()
    small = hip.hipMalloc(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[1])))
    big = hip.hipMalloc(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[2])))
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    info = hip.hipMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    print(json.dumps({"count_rc": count_rc, "count": count.value, "small": small, "big": big, "info": info}))
""")


def _run(env) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(MIB), str(200 * MIB)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_real_runtime_errors_come_through_the_hook(hook_build: HookBuild, tmp_path):
    assert ctypes.util.find_library("amdhip64"), \
        "Debian's libamdhip64 is not installed (make -C hook real-runtime installs it)"
    bare = _run(hook_build.env(tmp_path, hooked=False, HIP_DEVICE_MEMORY_LIMIT_0="100m"))
    hooked = _run(hook_build.env(tmp_path, HIP_DEVICE_MEMORY_LIMIT_0="100m"))
    # no GPU: the runtime itself says so, with or without the hook
    assert bare["count_rc"] != HIP_SUCCESS and bare["count"] == 0
    assert hooked["count_rc"] == bare["count_rc"] and hooked["count"] == 0
    assert hooked["small"] == bare["small"] != HIP_SUCCESS  # within the slice: the runtime's own error
    assert hooked["info"] == bare["info"] != HIP_SUCCESS
    # past the slice: refused by the hook, so it really is bound to the real runtime's symbols
    assert bare["big"] != HIP_ERROR_OUT_OF_MEMORY
    assert hooked["big"] == HIP_ERROR_OUT_OF_MEMORY
