"""A keeper whose node was dropped (declared lost after a stall, though it lives on) is stopped and its node
store removed once a newer step is committed elsewhere, on a real 3-node Ray cluster; every committed step
the job can still restore is restored bit-exactly from the live stores."""
import os
import sys
import time

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

import checkpoint_helpers as helpers  # noqa: E402

from autohet_ray.checkpoint import (AsyncSnapshotter, SnapshotPolicy, assign_writers, find_manifest,  # noqa: E402
                                    restore)
from autohet_ray.elastic.commit import Committer  # noqa: E402
from autohet_ray.elastic.keeper import KeeperTier, get_keeper, keeper_spec, stop_keeper  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402

pytestmark = pytest.mark.timeout(300)
JOB = "dropped-keeper-job"


@pytest.fixture(scope="module")
def cluster():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers cannot import test modules
    ray.cloudpickle.register_pickle_by_value(helpers)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = {name: cluster.add_node(num_cpus=0, resources={f"node_{name}": 1}) for name in ("b", "c")}
    ray.init(address=cluster.address, namespace="dropped-keeper-test")
    yield {"h": cluster.head_node.node_id, **{name: node.node_id for name, node in nodes.items()}}
    ray.shutdown()
    cluster.shutdown()


@ray.remote(num_cpus=0, max_restarts=0)
class Rank:
    """A training worker: snapshots its shards into its node's keeper and a peer node's keeper."""

    def save(self, step, state, owned, local, peer):
        snap = AsyncSnapshotter(local=KeeperTier(get_keeper(JOB, local[0]), local[1]),
                                peers=[KeeperTier(get_keeper(JOB, peer[0]), peer[1])],
                                policy=SnapshotPolicy(storage_every=0, num_threads=2))
        records = snap.snapshot(step, state, owned=owned).fast_result(timeout=60).records
        snap.close()
        return records


def keeper_alive(node_id: str) -> bool:
    try:
        get_keeper(JOB, node_id)
    except ValueError:
        return False
    return True


def test_a_dropped_keeper_is_stopped_once_a_newer_step_is_committed(cluster, tmp_path):
    specs = {name: keeper_spec(JOB, node_id, name) for name, node_id in cluster.items()}
    dropped_dir = specs["c"]["dir"]
    committer = Committer(keeper_specs=dict(specs), storage=storage_spec(str(tmp_path)), extra={}, gc_every=0)
    rank = Rank.options(resources={"node_b": 0.01}).remote()
    try:
        full5, full6 = helpers.full_state(5), helpers.full_state(6)
        whole5, whole6 = helpers.rank_states(full5, 1)[0], helpers.rank_states(full6, 1)[0]
        owned = assign_writers({0: [(n, c, t.numel()) for n, (t, _, c) in whole5.items()]})[0]
        committer.commit_fast(5, [ray.get(rank.save.remote(5, whole5, owned, (cluster["b"], "keeper-b"),
                                                           (cluster["c"], "keeper-c")), timeout=120)])
        committer.drop_keeper("c")              # declared lost after a stall; its node (and keeper) live on
        assert committer.rereplicate_newest() > 0
        ray.wait(committer.copies, num_returns=len(committer.copies), timeout=60)
        assert committer.copied_bytes(committer.copies, "a second copy") > 0            # step 5's second copies: on h
        committer.dropped.wait(5.0)
        assert keeper_alive(cluster["c"]) and os.path.isdir(dropped_dir)   # step 5 may still need it: kept
        committer.commit_fast(6, [ray.get(rank.save.remote(6, whole6, owned, (cluster["b"], "keeper-b"),
                                                           (cluster["h"], "keeper-h")), timeout=120)])
        committer.dropped.wait(60.0)
        assert [f.result() for f in committer.dropped.stopping] == [True]
        deadline = time.monotonic() + 30
        while keeper_alive(cluster["c"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not keeper_alive(cluster["c"]) and not os.path.exists(dropped_dir)
        assert committer.dropped.remaining() == []
        live = [KeeperTier(get_keeper(JOB, cluster[n]), f"keeper-{n}", timeout_s=20) for n in ("h", "b")]
        for step, full, whole in ((5, full5, whole5), (6, full6, whole6)):    # nothing committed was lost
            state, _ = restore(find_manifest(live, step), helpers.needs_of([whole])[0], live)
            helpers.assert_bit_exact(state, full)
        for name in ("h", "b"):                 # while each of them alone holds a copy of both steps
            alone = [KeeperTier(get_keeper(JOB, cluster[name]), f"keeper-{name}", timeout_s=20)]
            state, _ = restore(find_manifest(alone, 6), helpers.needs_of([whole6])[0], alone)
            helpers.assert_bit_exact(state, full6)
    finally:
        ray.kill(rank, no_restart=True)
        committer.close()
        for node_id in cluster.values():
            stop_keeper(JOB, node_id)


@ray.remote(num_cpus=0)
def failing_copy():
    raise OSError("disk full on the target store")


def test_a_copy_that_fails_is_printed_and_counts_no_bytes(cluster, tmp_path, capsys):
    specs = {name: keeper_spec(JOB, node_id, name) for name, node_id in cluster.items()}
    committer = Committer(keeper_specs=specs, storage=storage_spec(str(tmp_path)), extra={}, gc_every=0)
    try:
        ref = failing_copy.remote()
        ray.wait([ref], timeout=60)
        assert committer.copied_bytes([ref], "a stage-in copy for the next plan") == 0
        assert len(committer.skipped) == 1
        assert "a stage-in copy for the next plan" in committer.skipped[0]
        assert "disk full on the target store" in committer.skipped[0]
        assert "a stage-in copy for the next plan" in capsys.readouterr().err
    finally:
        committer.close()
        for node_id in cluster.values():
            stop_keeper(JOB, node_id)
