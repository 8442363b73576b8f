"""The kubectl plugin's input checks and request building (rocshare.kubectl_rocshare): each problem
named before anything is written; the generation goes past the pod's last request and record."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, \
    encode_record
from rocshare.api.resize import RESIZE_ANNOTATION, RESIZED_CONDITION, condition_message, decode_request
from rocshare.kubectl_rocshare import UsageError, build_parser, main, next_request, outcome, pod_name

RECORD = AllocationRecord(node="n1", containers=[ContainerAllocation(name="app", devices=[
    DeviceSlice(gpu_id="G", memory_mib=4096, cu_ranges=[(0, 9)], cu_count=10, cores_pct=10)])])


def pod(annotations: dict, conditions=()) -> dict:
    return {"metadata": {"name": "nb", "namespace": "ns", "annotations": annotations},
            "status": {"conditions": list(conditions)}}


@pytest.mark.parametrize(("argv", "problem"), [
    (["resize", "pod/nb", "--gpumem", "8Gi"], "--gpumem is in MiB per GPU (e.g. 8192 for 8 GiB): '8Gi' is not a whole"),
    (["resize", "pod/nb", "--gpumem", "0"], "--gpumem is in MiB per GPU (e.g. 8192 for 8 GiB): 0 is out of range"),
    (["resize", "pod/nb", "--gpucores", "101"], "--gpucores is in percent of each GPU's compute units: 101 is out"),
    (["resize", "pod/nb", "--gpucores", "50.5"], "'50.5' is not a whole number"),
])
def test_bad_figures_are_named(argv, problem, capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(argv)
    assert stopped.value.code == 2 and problem in capsys.readouterr().err


def test_nothing_to_change_and_other_kinds_are_refused_before_connecting(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["resize", "pod/nb", "--kubeconfig", "/nonexistent"])
    assert stopped.value.code == 2 and "say what to change" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["resize", "deployment/nb", "--gpumem", "1", "--kubeconfig", "/nonexistent"])
    assert "only pods can be resized, not 'deployment'" in capsys.readouterr().err


def test_pod_name_forms():
    assert pod_name("pod/nb") == pod_name("pods/nb") == pod_name("nb") == "nb"
    with pytest.raises(UsageError, match="names no pod"):
        pod_name("pod/")


def test_generation_goes_past_the_request_and_the_record():
    first = next_request(pod({ALLOCATION_ANNOTATION: encode_record(RECORD)}), memory_mib=8192, cores_pct=None,
                         container=None)
    assert first.generation == 1 and first.memory_mib == 8192 and first.cores_pct is None
    applied = RECORD.model_copy(update={"resize_generation": 4})
    later = next_request(pod({ALLOCATION_ANNOTATION: encode_record(applied),
                              RESIZE_ANNOTATION: '{"version":1,"generation":6,"coresPct":5}'}),
                         memory_mib=None, cores_pct=50, container="app")
    assert later.generation == 7 and decode_request(
        '{"version":1,"generation":7,"coresPct":50,"container":"app"}') == later


def test_a_pod_without_a_record_is_refused():
    with pytest.raises(UsageError, match="holds no rocshare GPU slice"):
        next_request(pod({}), memory_mib=1, cores_pct=None, container=None)


def test_outcome_reads_only_the_answer_to_its_generation():
    old = {"type": RESIZED_CONDITION, "status": "True", "reason": "Resized", "message": condition_message(1, "ok")}
    assert outcome(pod({}, [old]), 2) is None
    refused = {**old, "status": "False", "reason": "ResizeInsufficientCores", "message": condition_message(2, "full")}
    assert outcome(pod({}, [refused]), 2) == (False, "ResizeInsufficientCores: generation 2: full")
    assert outcome(pod({}, [old]), 1) == (True, "Resized: generation 1: ok")
    assert outcome(pod({}, [{**old, "message": condition_message(12, "x")}]), 1) is None
