"""Node keepers on a 3-node local Ray cluster: shards outlive worker deaths, and after a real node loss
(`remove_node(..., allow_graceful=False)`) the peer copies restore every tensor bit-exactly."""
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

import checkpoint_helpers as helpers  # noqa: E402

from autohet_ray.checkpoint import (AsyncSnapshotter, SnapshotPolicy, assign_writers, choose_peers,  # noqa: E402
                                    commit_step, find_manifest, latest_committed_step, restore)
from autohet_ray.elastic.keeper import KeeperTier, get_keeper, start_keeper, stop_keeper  # noqa: E402
from autohet_ray.emulate.cluster import FAST_HEALTH_CHECKS  # noqa: E402

NODES = {"a": "H100", "b": "H20", "c": "H20"}
JOB = "keeper-test-job"


@pytest.fixture(scope="module")
def cluster():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers cannot import test modules
    ray.cloudpickle.register_pickle_by_value(helpers)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": FAST_HEALTH_CHECKS})
    nodes = {name: cluster.add_node(num_cpus=0, resources={f"node_{name}": 1, f"gpu_{gpu}": 1})
             for name, gpu in NODES.items()}
    ray.init(address=cluster.address, namespace="keeper-test")
    node_ids = {name: node.node_id for name, node in nodes.items()}
    yield cluster, nodes, node_ids
    for node_id in node_ids.values():
        stop_keeper(JOB, node_id)
    ray.shutdown()
    cluster.shutdown()


@ray.remote(num_cpus=0, max_restarts=0)
class Rank:
    """A training worker: snapshots its shards into its node's keeper and its peer node's keeper."""

    def save(self, step, state, owned, local, peers, job=JOB):
        def tier(node_id, label):
            return KeeperTier(get_keeper(job, node_id), label)

        snap = AsyncSnapshotter(local=tier(*local), peers=[tier(*p) for p in peers],
                                policy=SnapshotPolicy(storage_every=0, num_threads=2))
        records = snap.snapshot(step, state, owned=owned).fast_result(timeout=60).records
        snap.close()
        return records


def test_keepers_survive_worker_death_and_peer_copies_survive_node_loss(cluster):
    cluster_obj, nodes, node_ids = cluster
    keepers = {name: start_keeper(JOB, node_ids[name], label=f"keeper-{name}") for name in NODES}
    assert {name: ray.get(k.node_id.remote()) for name, k in keepers.items()} == node_ids     # pinned
    tiers = {name: KeeperTier(k, f"keeper-{name}", timeout_s=20) for name, k in keepers.items()}
    peers = choose_peers({n: n for n in NODES}, NODES)
    assert NODES[peers["a"][0]] != "H100" and peers["b"] == ["a"]       # another GPU pool first

    full = helpers.full_state(3)
    states = helpers.rank_states(full, 2)                                # TP2 ranks on nodes a and b
    owned = assign_writers({r: [(n, c, t.numel()) for n, (t, _, c) in st.items()] for r, st in enumerate(states)})
    ranks = [Rank.options(resources={f"node_{n}": 0.01}).remote() for n in "ab"]
    records = []
    for rank, node in enumerate("ab"):
        local = (node_ids[node], f"keeper-{node}")
        peer = [(node_ids[p], f"keeper-{p}") for p in peers[node]]
        records += ray.get(ranks[rank].save.remote(3, states[rank], owned[rank], local, peer), timeout=120)
    manifest = commit_step(3, records, list(tiers.values()))
    assert all(len(r.replicas) == 2 for r in manifest.records)

    for handle in ranks:                                                 # the workers die; the bytes stay
        ray.kill(handle, no_restart=True)
    state, report = restore(manifest, helpers.needs_of(helpers.rank_states(full, 1))[0], [tiers["a"]] + [tiers["b"]])
    helpers.assert_bit_exact(state, full)
    assert report.tiers["keeper-a"].bytes_read > 0

    # keeper-to-keeper replication: a pushes its own chunks to c as well
    own_a = [r.key for r in manifest.records if r.replicas[0] == "keeper-a"]
    digests = {r.key: r.digest for r in manifest.records if r.key in own_a}
    sent = ray.get(keepers["a"].replicate.remote(digests, f"keeper-{JOB}-{node_ids['c']}"), timeout=60)
    assert sent["bytes"] > 0 and not sent["refused"] and all(tiers["c"].has(key) for key in own_a)

    # a real node loss: keeper a dies with its node; the peer copies on b and c restore everything
    cluster_obj.remove_node(nodes["a"], allow_graceful=False)
    deadline = time.monotonic() + 30
    while any(n["NodeID"] == node_ids["a"] and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "node loss not detected"
        time.sleep(0.2)
    all_tiers = [tiers["a"], tiers["b"], tiers["c"]]
    assert latest_committed_step(all_tiers[1:]) == 3
    manifest = find_manifest(all_tiers[1:], 3)
    for needs in helpers.needs_of(helpers.rank_states(full, 3)):         # re-planned: 3-way on what is left
        state, report = restore(manifest, needs, all_tiers)
        helpers.assert_bit_exact(state, full)
        assert report.tiers["keeper-a"].chunks_read == 0
        assert report.tiers["keeper-a"].unavailable == report.saved_chunks_fetched   # reported, not hidden
        assert any("keeper-a unavailable" in line for line in report.fallbacks)

    # garbage collection deletes many chunks in one keeper call
    tiers["c"].delete_many(own_a)
    assert own_a and not any(tiers["c"].has(key) for key in own_a)


def test_after_a_loss_chunks_left_with_one_copy_get_a_second_one(cluster, tmp_path):
    """The newest committed step's chunks were on nodes b and c; c is lost, so the committer has b copy them
    to the head node's store; then b is lost too before any new commit, and the head alone restores the step
    bit-exactly (no storage)."""
    from autohet_ray.elastic.commit import Committer
    from autohet_ray.elastic.keeper import keeper_spec
    from autohet_ray.storage.spec import storage_spec
    cluster_obj, nodes, node_ids = cluster
    job = "rereplicate-test-job"
    where = {"h": cluster_obj.head_node.node_id, "b": node_ids["b"], "c": node_ids["c"]}
    specs = {name: keeper_spec(job, node_id, name) for name, node_id in where.items()}
    committer = Committer(keeper_specs=specs, storage=storage_spec(str(tmp_path)), extra={}, gc_every=0)
    try:
        full = helpers.full_state(3)
        whole = helpers.rank_states(full, 1)[0]
        owned = assign_writers({0: [(n, c, t.numel()) for n, (t, _, c) in whole.items()]})
        rank = Rank.options(resources={"node_b": 0.01}).remote()
        records = ray.get(rank.save.remote(5, whole, owned[0], (where["b"], "keeper-b"), [(where["c"], "keeper-c")],
                                          job),
                          timeout=120)
        ray.kill(rank, no_restart=True)
        committer.commit_fast(5, [records])
        committer.drop_keeper("c")                                      # c is lost
        assert committer.rereplicate_newest() == len(find_manifest(list(committer.keepers.values()), 5).records)
        assert sum(out["bytes"] for out in ray.get(committer.copies, timeout=60)) > 0
        stop_keeper(job, where["b"])                                    # b is lost as well: h alone holds step 5
        head = KeeperTier(get_keeper(job, where["h"]), "keeper-h", timeout_s=20)
        state, _ = restore(find_manifest([head], 5), helpers.needs_of([whole])[0], [head])
        helpers.assert_bit_exact(state, full)
    finally:
        for node_id in where.values():
            stop_keeper(job, node_id)


def _corrupt_every_chunk(store_dir: str, step: int) -> int:
    """Flip the last byte of every chunk file of `step` in a node store; how many."""
    files = [p for p in (Path(store_dir) / f"step-{step:010d}").rglob("*") if p.is_file()]
    for path in files:
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(raw)
    return len(files)


def test_promote_uploads_only_chunks_that_pass_their_hash(cluster, tmp_path, capfd):
    """Step 6 is in the stores of b and c; every chunk b holds is corrupted: the chunks b was to upload are
    refused (one stderr line each) and uploaded from c, and the storage manifest no longer lists b for them.
    Step 7's chunks are corrupted in both stores: promote fails and commits nothing to the storage."""
    from autohet_ray.checkpoint import CheckpointError, scan_manifests
    from autohet_ray.elastic.commit import Committer
    from autohet_ray.elastic.keeper import keeper_spec
    from autohet_ray.storage.spec import storage_spec
    cluster_obj, nodes, node_ids = cluster
    job = "checked-copy-test-job"
    specs = {name: keeper_spec(job, node_ids[name], name) for name in "bc"}
    committer = Committer(keeper_specs=specs, storage=storage_spec(str(tmp_path)), extra={}, gc_every=0)
    try:
        full = helpers.full_state(3)
        whole = helpers.rank_states(full, 1)[0]
        owned = assign_writers({0: [(n, c, t.numel()) for n, (t, _, c) in whole.items()]})
        rank = Rank.options(resources={"node_b": 0.01}).remote()
        for step in (6, 7):
            records = ray.get(rank.save.remote(step, whole, owned[0], (node_ids["b"], "keeper-b"),
                                               [(node_ids["c"], "keeper-c")], job), timeout=120)
            committer.commit_fast(step, [records])
        ray.kill(rank, no_restart=True)
        assert _corrupt_every_chunk(specs["b"]["dir"], 6) == len(records)
        capfd.readouterr()
        committer.promote(6)
        refused = [line for line in capfd.readouterr().err.splitlines() if "copy refused" in line]
        assert refused and all("step 6" in line and "keeper-b -> storage: hash mismatch" in line for line in refused)
        stored = find_manifest([committer.storage], 6)
        assert sum("keeper-b" not in r.replicas for r in stored.records) == len(refused)
        state, _ = restore(stored, helpers.needs_of([whole])[0], [committer.storage])
        helpers.assert_bit_exact(state, full)                            # the storage holds good bytes only
        for name in "bc":
            _corrupt_every_chunk(specs[name]["dir"], 7)
        with pytest.raises(CheckpointError, match="no live node store with a good copy"):
            committer.promote(7)
        assert list(scan_manifests([committer.storage]).steps) == [6]     # no manifest over refused bytes
    finally:
        committer.close()
        for name in "bc":
            stop_keeper(job, node_ids[name])


def test_the_keepers_module_imports_no_torch():
    """A keeper process imports only its actor's module: torch there would cost every keeper start ~1.5 s of CPU
    (it crept back once through elastic/tiers.py importing the codec for its digest)."""
    import subprocess
    code = "import sys, autohet_ray.elastic.keeper; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
