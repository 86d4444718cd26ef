"""The Ray tier's shared clusters (see shared_clusters.py), among them the 3-node emulated cluster (two H800 nodes
with one GPU each, one H20 node with two) that several modules ask for as `three_node_cluster`."""
from __future__ import annotations

import signal

import pytest

from ray_helpers import THREE_NODES
from shared_clusters import SharedClusters, group_by_cluster, shared_cluster

three_node_cluster = shared_cluster(THREE_NODES, name="three_node_cluster")


@pytest.fixture(scope="session")
def shared_clusters():
    clusters = SharedClusters()
    yield clusters
    clusters.close()


def pytest_collection_modifyitems(config, items):
    items[:] = group_by_cluster(items)


# A shell that starts the suite in the background sets SIGINT to "ignored", and every child inherits that: the
# tests that Ctrl-C an `autohet train` process need SIGINT at its default there, as in a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
