"""Recovery on a live Ray cluster: recovery/policy.py's Recovery (the decisions and the state behind them)
plus what asks Ray: the nodes the next plan may use, stage-in copies toward it, and whether the cluster is
healthy."""
from __future__ import annotations

import time

import ray

from autohet_ray.cluster.node_probe import probe_all
from autohet_ray.elastic.liveness import raylet_addresses, refused_raylets
from autohet_ray.job.stage_in import copies_after_loss
from autohet_ray.recovery.policy import Recovery


class LiveRecovery(Recovery):
    def usable_nodes(self) -> list[dict]:
        """The `ray.nodes()` entries of live nodes the job may use: alive, raylet not refusing, not draining and
        not already found lost (a replacement may join under the name of a node that is still draining)."""
        alive = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] not in self.draining | self.gone]
        refused = refused_raylets(alive)
        return [n for n in alive if n["NodeID"] not in refused]

    def dead_nodes(self, cluster, usable: list[dict] | None = None) -> list[str]:
        """Nodes of `cluster` (the cluster file) with no usable live Ray node (see usable_nodes)."""
        return super().dead_nodes(cluster, usable or self.usable_nodes())

    def start_stage_in(self, committer, *, plan_cache: dict, cluster, lost_nodes: list[str], model) -> None:
        """(local_first only) Start copying to each surviving node's store what its ranks read under the next
        plan (job/stage_in.py)."""
        if self.mode != "local_first":
            return
        manifest = committer.newest_manifest()
        copies = copies_after_loss(plan_cache, cluster, lost_nodes, model, manifest,
                                   committer.node_of_store()) if manifest else {}
        self.staging = committer.send_copies(copies, manifest)

    def wait_stage_in(self, committer, timeout_s: float) -> dict:
        """Wait for start_stage_in's copies (a failed or late one costs only time: the restore reads elsewhere)."""
        start, refs, self.staging = time.perf_counter(), self.staging, []
        ready = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0] if refs else []
        return {"stage_in_wait_s": time.perf_counter() - start,
                "stage_in_bytes": committer.copied_bytes(ready, "a stage-in copy for the next plan")}


def healthy(group, node_ids: dict[str, str], store_nodes: tuple[str, ...], checks: int = 3,
            every_s: float = 0.3) -> bool:
    """Every plan node's and store node's raylet answers and every worker of `group` answers a ping, `checks`
    times in a row."""
    nodes = sorted({s["node"] for s in group.slots} | set(store_nodes))
    for i in range(checks):
        addresses = raylet_addresses(node_ids[node] for node in nodes)
        if None in addresses.values() or any(v != "ok" for v in probe_all(addresses).values()):
            return False
        dead, silent = group.ping(timeout_s=1.0)
        if dead or silent:
            return False
        if i + 1 < checks:
            time.sleep(every_s)
    return True
