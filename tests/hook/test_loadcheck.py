"""rocshare-loadcheck (hook/src/loadcheck.c), the createContainer hook that refuses a slice container in
which the memory hook cannot load: the built program (plain, ASan, UBSan) run on OCI bundles crafted in
temp folders, as runc hands them to it (the OCI state on stdin, config.json in the bundle).

Each refused case is also shown to be a real hole: the same root filesystem, run in a chroot under
LD_AUDIT with a witness audit library (it prints from la_version), runs its program without the audit
library loaded -- what the container did before the check existed (fea6fe5 gave the container no
hook at all: it started, unlimited). The witness stands in for the hook: any audit library the loader
refuses is refused for the same reasons. The glibc case is the control: the witness loads there and
the check lets it start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hook.conftest import HOOK_DIR

AUDIT_PATH = "/usr/local/vgpu/libamvgpu.so"
HOST_LOADER = Path("/lib64/ld-linux-x86-64.so.2").resolve()
HOST_LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
MUSL_LIBC = Path("/usr/lib/x86_64-linux-musl/libc.so")
WITNESS_LINE = "audit library loaded"

PROGRAM_C = '#include <stdio.h>\nint main(void) { puts("program ran"); return 0; }\n'
# closefrom (GLIBC_2.34) is never called: it gives the witness a version need newer than old_libc's.
WITNESS_C = ('#define _GNU_SOURCE\n#include <link.h>\n#include <unistd.h>\n'
             'void rocshare_witness_unused(void) { closefrom(1000); }\n'
             'unsigned la_version(unsigned v) { write(2, "' + WITNESS_LINE + '\\n", 21); return v; }\n')
OLD_LIBC_C = "int rocshare_old_libc_marker(void) { return 0; }\n"
OLD_LIBC_VERSIONS = "GLIBC_2.2.5 { global: rocshare_old_libc_marker; local: *; };\nGLIBC_2.17 { } GLIBC_2.2.5;\n"


@dataclass(frozen=True)
class Artifacts:
    checks: dict[str, Path]  # plain / asan / ubsan builds of rocshare-loadcheck
    glibc_program: Path
    static_program: Path
    musl_program: Path
    witness: Path  # an audit library built here: what the hook library needs, it needs (glibc)
    old_libc: Path  # a libc.so.6 defining only GLIBC_2.2.5 and GLIBC_2.17


def _cc(compiler: str, out: Path, source: str, *flags: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([compiler, "-O1", "-o", str(out), str(src), *flags], check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    if not shutil.which("musl-gcc"):
        pytest.fail("musl-gcc is missing: run dev/hook/install-deps.sh (Debian's musl-tools)")
    subprocess.run(["make", "-C", str(HOOK_DIR), "-s", "loadcheck-test"], check=True, capture_output=True,
                   timeout=600)
    build = HOOK_DIR / "build"
    folder = tmp_path_factory.mktemp("loadcheck-artifacts")
    versions = folder / "old-libc.map"
    versions.write_text(OLD_LIBC_VERSIONS)
    return Artifacts(
        checks={kind: build / kind / "rocshare-loadcheck" for kind in ("plain", "asan", "ubsan")},
        glibc_program=_cc("gcc", folder / "glibc-app", PROGRAM_C),
        static_program=_cc("gcc", folder / "static-app", PROGRAM_C, "-static"),
        musl_program=_cc("musl-gcc", folder / "musl-app", PROGRAM_C),
        witness=_cc("gcc", folder / "witness.so", WITNESS_C, "-shared", "-fPIC", "-Wl,-z,defs"),
        old_libc=_cc("gcc", folder / "libc.so.6", OLD_LIBC_C, "-shared", "-fPIC", "-nostdlib",
                     "-Wl,-soname,libc.so.6", f"-Wl,--version-script={versions}"),
    )


@pytest.fixture(params=["plain", "asan", "ubsan"])
def check(request: pytest.FixtureRequest, artifacts: Artifacts) -> Path:
    return artifacts.checks[request.param]


# ---- a bundle: what runc hands a createContainer hook ----------------------------------------------


def _install(root: Path, source: Path, inside: str, mode: int = 0o755) -> None:
    target = root / inside.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(mode)


def glibc_root(root: Path, artifacts: Artifacts, *, libc: Path = HOST_LIBC) -> Path:
    """Debian's layout: the loader in the multiarch folder (where the audit namespace looks for it,
    since libc.so.6 needs it by name), /lib64's name a link to it."""
    _install(root, HOST_LOADER, "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    (root / "lib64").mkdir()
    (root / "lib64/ld-linux-x86-64.so.2").symlink_to("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    _install(root, libc, "/lib/x86_64-linux-gnu/libc.so.6")
    _install(root, artifacts.witness, AUDIT_PATH, 0o644)
    return root


def bundle(folder: Path, *, args: list[str], env: list[str] | None = None, root: str = "rootfs",
           annotations: dict[str, str] | None = None) -> Path:
    env = ["PATH=/usr/local/bin:/usr/bin:/bin", f"LD_AUDIT={AUDIT_PATH}"] if env is None else env
    config = {"ociVersion": "1.2.0", "root": {"path": root},
              "process": {"args": args, "env": env, "cwd": "/"}, "annotations": annotations or {}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def run_check(check: Path, bundle_dir: Path, library: Path, *extra: str) -> subprocess.CompletedProcess:
    state = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1, "bundle": str(bundle_dir)}
    env = {"ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"}
    return subprocess.run([str(check), "--library", str(library), "--audit-path", AUDIT_PATH, *extra],
                          input=json.dumps(state), capture_output=True, text=True, timeout=60, env=env)


def run_in_root(root: Path, program: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """What the container would do without the check: its program, in its root, with its env."""
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    return subprocess.run([chroot, str(root), program], env=env, capture_output=True, text=True, timeout=60)


def assert_refused(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rocshare: refusing to start "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


# ---- the cases -------------------------------------------------------------------------------------


def test_glibc_program_with_the_hook_starts(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.glibc_program, "/usr/bin/app")
    result = run_check(check, bundle(tmp_path, args=["app"]), artifacts.witness)
    assert result.returncode == 0 and result.stderr == "", result
    ran = run_in_root(root, "/usr/bin/app", {"LD_AUDIT": AUDIT_PATH})
    assert ran.stdout == "program ran\n" and WITNESS_LINE in ran.stderr, ran  # control: the witness loads


def test_static_program_is_refused(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.static_program, "/usr/bin/app")
    assert_refused(run_check(check, bundle(tmp_path, args=["app"]), artifacts.witness),
                   "/usr/bin/app is a static executable", "start app:")
    ran = run_in_root(root, "/usr/bin/app", {"LD_AUDIT": AUDIT_PATH})
    assert ran.stdout == "program ran\n" and WITNESS_LINE not in ran.stderr, ran


def test_musl_program_is_refused(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, MUSL_LIBC, "/lib/ld-musl-x86_64.so.1")
    _install(root, artifacts.musl_program, "/usr/local/bin/app")
    assert_refused(run_check(check, bundle(tmp_path, args=["/usr/local/bin/app"]), artifacts.witness),
                   "loader /lib/ld-musl-x86_64.so.1 is not glibc's but musl's")
    ran = run_in_root(root, "/usr/local/bin/app", {"LD_AUDIT": AUDIT_PATH})
    assert ran.stdout == "program ran\n" and WITNESS_LINE not in ran.stderr, ran


def test_libc_lacking_a_version_the_hook_needs_is_refused(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    needed = _glibc_versions_needed(artifacts.witness)
    assert needed - {"GLIBC_2.2.5", "GLIBC_2.17"}, needed  # the witness needs a version the old libc lacks
    root = glibc_root(tmp_path / "rootfs", artifacts, libc=artifacts.old_libc)
    _install(root, artifacts.glibc_program, "/usr/bin/app")
    result = run_check(check, bundle(tmp_path, args=["app"]), artifacts.witness)
    missing = sorted(needed - {"GLIBC_2.2.5", "GLIBC_2.17"})
    assert_refused(result, "/lib/x86_64-linux-gnu/libc.so.6 lacks version GLIBC_2.", "too old")
    assert any(version in result.stderr for version in missing), (missing, result.stderr)


def test_ld_audit_replaced_by_the_pod_is_refused(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.glibc_program, "/usr/bin/app")
    # The device's LD_AUDIT first, then the pod's own env: the kubelet appends it, the runtime keeps the last.
    env = ["PATH=/usr/bin", f"LD_AUDIT={AUDIT_PATH}", "LD_AUDIT=/nonexistent.so"]
    assert_refused(run_check(check, bundle(tmp_path, args=["app"], env=env), artifacts.witness),
                   "LD_AUDIT=/nonexistent.so, which does not name the hook")
    ran = run_in_root(root, "/usr/bin/app", {"LD_AUDIT": "/nonexistent.so"})
    assert ran.stdout == "program ran\n" and WITNESS_LINE not in ran.stderr, ran
    assert_refused(run_check(check, bundle(tmp_path, args=["app"], env=["PATH=/usr/bin"]), artifacts.witness),
                   "no LD_AUDIT naming the hook")


def test_symlink_out_of_the_root_resolves_inside_it(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    """/usr/bin/app -> ../../../..<outside>/app: followed on the host it reaches a glibc program; in the
    container's root (where it will run) it reaches a static one, which is what the check must judge."""
    outside = tmp_path / "outside"
    _install(outside, artifacts.glibc_program, "/app")
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.static_program, str(outside / "app"))
    link = root / "usr/bin/app"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("../" * 64 + str(outside / "app").lstrip("/"))
    assert link.resolve() == (outside / "app").resolve()  # on the host, the link leaves the root
    assert_refused(run_check(check, bundle(tmp_path, args=["app"]), artifacts.witness), "static executable")
    ran = run_in_root(root, "/usr/bin/app", {"LD_AUDIT": AUDIT_PATH})
    assert ran.stdout == "program ran\n" and WITNESS_LINE not in ran.stderr, ran


def test_script_is_judged_by_its_interpreter(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.static_program, "/bin/busybox")
    script = root / "usr/bin/run.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("#!/bin/busybox sh\nexec app\n")
    script.chmod(0o755)
    assert_refused(run_check(check, bundle(tmp_path, args=["run.sh"]), artifacts.witness),
                   "/bin/busybox is a static executable")


def test_program_missing_from_the_image_is_refused(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    glibc_root(tmp_path / "rootfs", artifacts)
    assert_refused(run_check(check, bundle(tmp_path, args=["app"]), artifacts.witness),
                   "app is not an executable file in the image")


@pytest.mark.parametrize("config", [
    "", "{", '{"root": {"path": "rootfs"}}', '{"root": {"path": "rootfs"}, "process": {"args": []}}',
    '{"root": {"path": "rootfs"}, "process": {"args": ["a\\u0000b"]}}', "[" * 100 + "]" * 100,
    '{"root": {"path": "rootfs"}, "process": {"args": ["app"], "env": [1]}}',
])
def test_unreadable_config_is_refused(tmp_path: Path, artifacts: Artifacts, config: str) -> None:
    (tmp_path / "config.json").write_text(config)
    for check in artifacts.checks.values():
        result = run_check(check, tmp_path, artifacts.witness)
        assert result.returncode == 1 and result.stderr.startswith("rocshare: refusing to start "), result


def test_duplicate_keys_read_as_runc_reads_them(tmp_path: Path, artifacts: Artifacts, check: Path) -> None:
    """Go's encoding/json keeps the last of duplicate keys; so must the check, or a crafted config
    could show it one program and runc another."""
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.glibc_program, "/usr/bin/app")
    _install(root, artifacts.static_program, "/usr/bin/static")
    env = json.dumps(["PATH=/usr/bin", f"LD_AUDIT={AUDIT_PATH}"])
    (tmp_path / "config.json").write_text(
        '{"root": {"path": "rootfs"}, "process": {"args": ["app"], "env": %s, "args": ["static"]}}' % env)
    assert_refused(run_check(check, tmp_path, artifacts.witness), "start static:")


POD_UID = "0d1c3e2a-5b6f-4c7d-8e9f-a0b1c2d3e4f5"


@pytest.mark.parametrize("program", ["app", "static"])
def test_the_check_leaves_a_witness_named_by_the_cri_annotations(tmp_path: Path, artifacts: Artifacts, check: Path,
                                                                 program: str) -> None:
    """The agent tells a runtime that ignored the CDI device by the witness's absence: the check leaves
    it whether it lets the container start or not, and only under a name made of the pod's uid and the
    container's name (an annotation that could name a path writes nothing)."""
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.glibc_program, "/usr/bin/app")
    _install(root, artifacts.static_program, "/usr/bin/static")
    witnesses = tmp_path / "witnesses"
    witnesses.mkdir()
    cri = {"io.kubernetes.cri.sandbox-uid": POD_UID, "io.kubernetes.cri.container-name": "main"}
    result = run_check(check, bundle(tmp_path, args=[program], annotations=cri), artifacts.witness,
                       "--witness-dir", str(witnesses))
    assert result.returncode == (0 if program == "app" else 1), result
    assert [p.name for p in witnesses.iterdir()] == [f"{POD_UID}_main"]
    (witnesses / f"{POD_UID}_main").unlink()
    forged = {"io.kubernetes.cri.sandbox-uid": "../../etc", "io.kubernetes.cri.container-name": "main"}
    run_check(check, bundle(tmp_path, args=[program], annotations=forged), artifacts.witness,
              "--witness-dir", str(witnesses))
    assert list(witnesses.iterdir()) == [] and not (tmp_path / "etc_main").exists()


def _glibc_versions_needed(library: Path) -> set[str]:
    out = subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True, check=True).stdout
    words = {word.strip("()") for line in out.splitlines() for word in line.split()}
    return {word for word in words if word.startswith("GLIBC_")}



# ---- under runc: the stage, the state on stdin, the host's view and the pod's volumes --------------


def _runc_bundle(folder: Path, artifacts: Artifacts, check: Path, *, program: str, mounts: list[dict]) -> Path:
    """A bundle as containerd writes one for a slice container: the hook library bind-mounted at the
    audit path, LD_AUDIT naming it, and the check as the createContainer hook CDI would add."""
    hook_dir = folder / "hookdir"
    hook_dir.mkdir()
    shutil.copyfile(artifacts.witness, hook_dir / "libamvgpu.so")
    (folder / "rootfs" / AUDIT_PATH.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (folder / "rootfs" / AUDIT_PATH.lstrip("/")).touch()
    config = {
        "ociVersion": "1.0.2", "root": {"path": "rootfs", "readonly": True}, "hostname": "slice",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "cwd": "/", "args": [program],
                    "env": ["PATH=/usr/bin:/data", f"LD_AUDIT={AUDIT_PATH}"]},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": AUDIT_PATH, "type": "bind", "source": str(hook_dir / "libamvgpu.so"),
                    "options": ["bind", "ro"]}, *mounts],
        "hooks": {"createContainer": [{"path": str(check), "args": [
            "rocshare-loadcheck", "--library", str(hook_dir / "libamvgpu.so"), "--audit-path", AUDIT_PATH]}]},
        "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]},
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _runc_run(bundle_dir: Path) -> subprocess.CompletedProcess:
    runc = shutil.which("runc") or "/usr/sbin/runc"
    state_root = bundle_dir / "runc-state"
    return subprocess.run([runc, "--root", str(state_root), "run", "--bundle", str(bundle_dir), f"lc-{os.getpid()}"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def test_runc_runs_the_check_at_create_container_with_the_pods_volumes(tmp_path: Path, artifacts: Artifacts) -> None:
    """runc (the one dev/realnode installs, as containerd uses it) runs createContainer hooks after the
    container's mounts: a glibc program on a volume is found and passes, its witness loads; the same
    volume holding a musl program is refused, with the line in runc's error (what the kubelet's event
    carries), and the program never runs."""
    if not shutil.which("runc") and not Path("/usr/sbin/runc").exists():
        pytest.fail("runc is missing: run dev/realnode/install-deps.sh")
    check = artifacts.checks["plain"]
    volume = tmp_path / "volume"
    volume.mkdir()
    shutil.copyfile(artifacts.glibc_program, volume / "app")
    (volume / "app").chmod(0o755)
    glibc = glibc_root(tmp_path / "good" / "rootfs", artifacts)
    (glibc / "data").mkdir()
    mount = [{"destination": "/data", "type": "bind", "source": str(volume), "options": ["rbind", "ro"]}]
    ran = _runc_run(_runc_bundle(tmp_path / "good", artifacts, check, program="app", mounts=mount))
    assert ran.returncode == 0 and ran.stdout == "program ran\n" and WITNESS_LINE in ran.stderr, ran

    shutil.copyfile(artifacts.musl_program, volume / "app")
    musl = glibc_root(tmp_path / "bad" / "rootfs", artifacts)
    (musl / "data").mkdir()
    _install(musl, MUSL_LIBC, "/lib/ld-musl-x86_64.so.1")
    refused = _runc_run(_runc_bundle(tmp_path / "bad", artifacts, check, program="app", mounts=mount))
    assert refused.returncode != 0 and "program ran" not in refused.stdout, refused
    assert "error running hook" in refused.stderr, refused.stderr
    assert "rocshare: refusing to start app: /data/app's loader /lib/ld-musl-x86_64.so.1 is not glibc's" in \
        refused.stderr, refused.stderr


def _user_bundle(folder: Path, *, uid: int, no_new_privs: bool) -> Path:
    bundle(folder, args=["app"])
    config = json.loads((folder / "config.json").read_text())
    config["process"].update(user={"uid": uid, "gid": uid}, noNewPrivileges=no_new_privs)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_set_user_id_program_is_refused_unless_privileges_cannot_rise(tmp_path: Path, artifacts: Artifacts,
                                                                       check: Path) -> None:
    """The loader runs a set-user-ID program in secure mode and drops LD_AUDIT: a tenant's image could
    carry one. With noNewPrivileges (allowPrivilegeEscalation: false) the bit does nothing."""
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.glibc_program, "/usr/bin/app", 0o4755)
    assert_refused(run_check(check, _user_bundle(tmp_path, uid=1000, no_new_privs=False), artifacts.witness),
                   "/usr/bin/app is set-user-ID")
    assert run_check(check, _user_bundle(tmp_path, uid=1000, no_new_privs=True), artifacts.witness).returncode == 0
    assert run_check(check, _user_bundle(tmp_path, uid=0, no_new_privs=False), artifacts.witness).returncode == 0
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    ran = subprocess.run([chroot, "--userspec=1000:1000", str(root), "/usr/bin/app"], env={"LD_AUDIT": AUDIT_PATH},
                         capture_output=True, text=True, timeout=60)
    assert ran.stdout == "program ran\n" and WITNESS_LINE not in ran.stderr, ran  # the hole: no audit library


def test_damaged_elf_files_are_refused_without_a_crash(tmp_path: Path, artifacts: Artifacts) -> None:
    """Every cut of the program's and the libc's first 4 KiB, and bytes flipped across their headers:
    the check answers (0 or a refusal line), never crashes, under ASan and UBSan too."""
    root = glibc_root(tmp_path / "rootfs", artifacts)
    program = artifacts.glibc_program.read_bytes()
    libc = HOST_LIBC.read_bytes()
    variants = [(program[:cut], libc) for cut in (0, 4, 20, 63, 64, 200, 700, 4096)]
    variants += [(program, libc[:cut]) for cut in (0, 64, 4096, len(libc) // 2)]
    variants += [(program[:k] + bytes([program[k] ^ 0xFF]) + program[k + 1:], libc) for k in range(16, 120, 7)]
    bundle(tmp_path, args=["app"])
    for program_bytes, libc_bytes in variants:
        (root / "usr/bin").mkdir(parents=True, exist_ok=True)
        (root / "usr/bin/app").write_bytes(program_bytes)
        (root / "usr/bin/app").chmod(0o755)
        (root / "lib/x86_64-linux-gnu/libc.so.6").write_bytes(libc_bytes)
        for kind in ("asan", "ubsan"):
            result = run_check(artifacts.checks[kind], tmp_path, artifacts.witness)
            assert result.returncode in (0, 1), result
            assert result.returncode == 0 or result.stderr.startswith("rocshare: refusing to start app: "), result
            assert "Sanitizer" not in result.stderr and "runtime error" not in result.stderr, result


def test_the_real_hook_passes_where_its_needs_are_met(tmp_path: Path, artifacts: Artifacts) -> None:
    """The check against rocshare's hook library itself (built here by its Makefile): this machine's
    glibc defines what it needs, so a glibc program starts; the same root with a static program is
    refused. The needs come from the library file, whatever its build."""
    subprocess.run(["make", "-C", str(HOOK_DIR), "-s", "build/librocshare-hook.so"], check=True, capture_output=True,
                   timeout=600)
    hook = HOOK_DIR / "build" / "librocshare-hook.so"
    assert _glibc_versions_needed(hook)  # it needs some GLIBC_x of libc.so.6
    root = glibc_root(tmp_path / "rootfs", artifacts)
    _install(root, artifacts.glibc_program, "/usr/bin/app")
    _install(root, artifacts.static_program, "/usr/bin/static")
    for check in artifacts.checks.values():
        assert run_check(check, bundle(tmp_path, args=["app"]), hook).returncode == 0
        assert_refused(run_check(check, bundle(tmp_path, args=["static"]), hook), "static executable")
