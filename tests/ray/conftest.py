"""A 3-node emulated Ray cluster (two H800 nodes with one GPU each, one H20 node with two) shared by a module."""
from __future__ import annotations

import pytest

from autohet_ray.cluster.spec import cluster_from_dict
from ray_helpers import THREE_NODES


@pytest.fixture(scope="module")
def three_node_cluster():
    from autohet_ray.emulate.cluster import emulated_cluster
    with emulated_cluster(cluster_from_dict(THREE_NODES)) as cluster:
        yield cluster
