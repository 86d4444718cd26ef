"""Standby workers (built beside the running ones before a prepared switch) get no GPU from Ray, so on a real GPU
node each is pinned to a GPU of its own: the node's GPUs in rank order, named as Ray names them."""
import pytest

from autohet_ray.runtime.device import node_gpu_id, standby_gpu_indices


@pytest.mark.parametrize("index, visible, expected", [
    (0, None, "0"), (3, None, "3"),             # the raylet sees every GPU of the node: ids are indices
    (0, "", "0"),
    (0, "4,5,6", "4"), (2, "4,5,6", "6"),       # the raylet was started with CUDA_VISIBLE_DEVICES=4,5,6
    (1, "GPU-aa11, GPU-bb22", "GPU-bb22"),      # UUIDs, spaces trimmed
])
def test_a_node_gpu_is_named_as_ray_names_it(index, visible, expected):
    assert node_gpu_id(index, visible) == expected


def test_a_gpu_past_the_node_s_list_is_refused_naming_the_list():
    with pytest.raises(ValueError, match=r"GPU 2 of this node does not exist: its CUDA_VISIBLE_DEVICES is '4,5' "
                                         r"\(2 GPU\(s\), 0 to 1\)"):
        node_gpu_id(2, "4,5")


def slots(*nodes):
    return [{"node": node} for node in nodes]


def test_each_standby_rank_on_a_real_node_gets_its_own_gpu_in_rank_order():
    got = standby_gpu_indices(slots("a", "b", "a", "b", "a"), {}, frozenset({"a", "b"}))
    assert got == {0: 0, 2: 1, 4: 2, 1: 0, 3: 1}


def test_emulated_nodes_and_nodes_with_reused_workers_are_not_pinned():
    got = standby_gpu_indices(slots("a", "e", "j", "a"), {"j": ["reused"]}, frozenset({"a", "j"}))
    assert got == {0: 0, 3: 1}          # e is emulated; j (a joined node) reuses the workers that hold its GPUs
