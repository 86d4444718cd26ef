"""A 3-node emulated Ray cluster (two H800 nodes with one GPU each, one H20 node with two) shared by a module."""
from __future__ import annotations

import signal

import pytest

from autohet_ray.cluster.spec import cluster_from_dict
from ray_helpers import THREE_NODES


@pytest.fixture(scope="module")
def three_node_cluster():
    from autohet_ray.emulate.cluster import emulated_cluster
    with emulated_cluster(cluster_from_dict(THREE_NODES)) as cluster:
        yield cluster

# A shell that starts the suite in the background sets SIGINT to "ignored", and every child inherits that: the
# tests that Ctrl-C an `autohet train` process need SIGINT at its default there, as in a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
