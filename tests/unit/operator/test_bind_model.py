"""Bind takes the GPUs filter's score assumed: on a fragmentation-aware pool, bind_decision plans
with the pool's fragmentation model, as filter does. Here the typical task asks 30 % of a GPU; one
GPU of the node is 60 % taken and a pod asks 25 %: binpack (the core's `allocate` without a model,
what bind used to run) puts it on that GPU and leaves 15 % no typical task can use, the model puts
it on an empty one (no fragment grows). Bind must take the model's GPU, the one filter scored."""

from __future__ import annotations

from rocshare.core.allocate import allocate
from rocshare.core.holdings import placement_request
from rocshare.core.ids import pod_key
from rocshare_dev.bench import extender as bench
from rocshare_dev.bench.fleet import NAMESPACE, pod_object
from rocshare_operator.extender.decisions import _Pass, bind_decision, policy_for
from rocshare_operator.extender.state import SchedulerState


def gpu_ids(record) -> list[str]:
    return [device.gpu_id for container in record.containers for device in container.devices]


def test_bind_takes_the_gpu_the_pools_fragmentation_model_chose() -> None:
    state = SchedulerState()
    (name,) = bench.build_nodes(state, 1, "fragmentation-aware")
    node = state.inventories[name]
    typical = placement_request(pod_object("typical", {"amd.com/gpu": "1", "amd.com/gpumem-percentage": "30",
                                                       "amd.com/gpucores": "30"}))
    record = allocate(node, state.ledger.usage(node), typical, policy_for(state.snapshot(), name, typical))
    for index in range(300):  # what the pool runs: 30 % slices
        bench.feed_workload(state, f"typical-{index}", record)
    big = placement_request(pod_object("big", {"amd.com/gpu": "1", "amd.com/gpumem-percentage": "60",
                                               "amd.com/gpucores": "60"}))
    taken = allocate(node, state.ledger.usage(node), big, policy_for(state.snapshot(), name, big))
    state.commit(pod_key(NAMESPACE, "big"), NAMESPACE, taken)
    pod = placement_request(pod_object("p", {"amd.com/gpu": "1", "amd.com/gpumem-percentage": "25",
                                             "amd.com/gpucores": "25"}))
    snap = state.snapshot()
    usage = snap.ledger.usage(node)
    plain = allocate(node, usage, pod, policy_for(snap, name, pod))
    assert gpu_ids(plain) == gpu_ids(taken)  # binpack: onto the GPU 60 % taken
    decided = bind_decision(snap, pod, name)
    plan = _Pass(snap, pod, memoised=False).way_of(name).planner.plan(node, usage)
    assert gpu_ids(decided) == [node.gpus[device.position].gpu_id for device in plan.containers[0]]
    assert gpu_ids(decided) != gpu_ids(taken)  # the model's choice: an empty GPU
