"""Device sets (issue 59): how `--devices`, `--set-size` and `--device-sets` become disjoint sets on a host,
and what is refused (`tuner.devices`, `tuner.search.pool.resolve_sets`). A GPU host is described by its
GPU count, so its rules are checked here without one."""

from __future__ import annotations

import os

import pytest

from tuner.devices import parse_ids, parse_sets, pin, split
from tuner.errors import UserError
from tuner.search.pool import resolve_sets
from tuner.settings import DeviceOptions


def test_ids_and_ranges_read_in_order():
    assert parse_ids("0-3") == [0, 1, 2, 3]
    assert parse_ids("4, 0-1,7") == [4, 0, 1, 7]
    with pytest.raises(ValueError, match="listed twice"):
        parse_ids("0-2,1")


def test_sets_split_in_order_and_leave_the_rest_out():
    assert split([0, 1, 2, 3, 4], 2) == [(0, 1), (2, 3)]
    plan = resolve_sets(DeviceOptions(ids="0-4", set_size=2), engine="vllm", gpu_count=8, layout_sizes=[1])
    assert plan.kind == "gpu" and plan.sets == [(0, 1), (2, 3)] and plan.left == [4]


def test_the_set_size_defaults_to_the_largest_layout_of_the_space():
    plan = resolve_sets(DeviceOptions(ids="0-7"), engine="vllm", gpu_count=8, layout_sizes=[1, 2, 4])
    assert plan.sets == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_a_set_smaller_than_a_tensor_parallel_layout_is_refused():
    with pytest.raises(UserError) as e:
        resolve_sets(DeviceOptions(ids="0-3", set_size=1), engine="vllm", gpu_count=4, layout_sizes=[1, 2])
    assert e.value.field == "--set-size" and "needs 2 GPUs" in e.value.message
    with pytest.raises(UserError) as e:
        resolve_sets(DeviceOptions(sets="0;1"), engine="vllm", gpu_count=4, layout_sizes=[2])
    assert e.value.field == "--device-sets"


def test_ids_the_host_does_not_have_are_refused():
    with pytest.raises(UserError) as e:
        resolve_sets(DeviceOptions(ids="0-4", set_size=1), engine="vllm", gpu_count=4, layout_sizes=[1])
    assert e.value.field == "--devices" and "device 4 is not on this host" in e.value.message


def test_overlapping_or_unequal_sets_are_refused():
    with pytest.raises(ValueError, match="set 1 and set 2"):
        parse_sets("0,1;1,2")
    with pytest.raises(ValueError, match="differ in size"):
        parse_sets("0;1,2")


def test_without_gpus_the_devices_are_cores_and_a_gpu_kind_is_refused():
    plan = resolve_sets(DeviceOptions(set_size=1), engine="vllm", gpu_count=0, layout_sizes=[])
    assert plan.kind == "cpu" and [i for s in plan.sets for i in s] == sorted(os.sched_getaffinity(0))
    with pytest.raises(UserError) as e:
        resolve_sets(DeviceOptions(kind="gpu", ids="0"), engine="vllm", gpu_count=0, layout_sizes=[])
    assert e.value.field == "--device-kind"


def test_pinning_confines_this_process_and_what_it_launches(monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    core = min(before)
    try:
        pin("cpu", (core,))
        assert os.sched_getaffinity(0) == {core} and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == str(core)
        pin("gpu", (2, 3))
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    finally:
        os.sched_setaffinity(0, before)


def test_a_simulated_engine_has_the_gpus_of_its_simulated_host():
    plan = resolve_sets(DeviceOptions(kind="gpu", ids="0-3", set_size=2), engine="sim", gpu_count=0,
                        layout_sizes=[1, 2], simulated=True)
    assert plan.sets == [(0, 1), (2, 3)]
    with pytest.raises(UserError, match="device 4 is not on this host"):
        resolve_sets(DeviceOptions(kind="gpu", ids="0-4", set_size=1), engine="sim", gpu_count=0,
                     layout_sizes=[1], simulated=True, simulated_gpus=4)
