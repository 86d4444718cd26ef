"""What each GPU snapshots per step under a plan, computed with the runtime's own code: the ranks' layouts
(runtime/parallelize.rank_layouts, as each Engine builds them), what each rank holds (orchestrate/worker.py
holdings_of_layout: fp32 master weights + two AdamW moments), and where an elastic job's snapshot routes put each
unique chunk (checkpoint/holdings.py: tiling_holdings + place_copies with 1 + num_peers node-store copies, as
snapshot_routes does). A rank copies off its GPU only the chunks it writes somewhere (`owned`, the union of its
routes); data-parallel and TP-replicated copies are written once per chosen node store, not by every holder.

The replay (benchmarks/spot_replay.py) prices the per-step snapshot from the busiest rank's bytes per second
of step; autohet_ray/replay cannot import runtime or checkpoint code (tests/unit/test_layering.py), so the
figure is computed here and stored with each planned state.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from autohet_ray.checkpoint.holdings import tiling_holdings
from autohet_ray.checkpoint.peers import place_copies
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import Plan, plan_from_dict
from autohet_ray.replay.planning import sub_cluster
from autohet_ray.runtime.optim import holdings_of_layout
from autohet_ray.runtime.parallelize import rank_layouts

NUM_PEERS = 1          # TrainJob's default num_peers: 2 node-store copies of every chunk


@dataclass(frozen=True, kw_only=True)
class SnapshotBytes:
    unique: int               # one copy of the whole training state (what a step's manifest holds)
    held: int                 # every rank's holdings summed (data-parallel copies included)
    copied_max: int           # the busiest rank: bytes it copies off its GPU and hashes per step
    copied_mean: float        # ... over the ranks of the plan
    written_max: int          # the busiest rank: bytes it writes to node stores per step (own node + pushes)
    writing_ranks: int        # ranks that copy anything
    ranks: int
    copied: dict[int, int]    # rank -> bytes it copies off its GPU per step (payload, without chunk headers)
    owned: dict[int, set]     # rank -> the (name, chunk)s it copies

    @property
    def busiest(self) -> int:
        """The busiest rank's bytes per step, copied or written, whichever is more (the figure priced)."""
        return max(self.copied_max, self.written_max)


def plan_holdings(plan: Plan, model: ModelSpec, master_dtype=torch.float32) -> tuple[dict, dict, dict]:
    """rank -> [(name, chunk, bytes)] as the workers report them (`master_dtype`: fp32 under bf16 compute),
    rank -> pipeline, rank -> node."""
    rank_map = build_rank_map(plan, model.num_layers)
    layouts = rank_layouts(plan, model)
    holdings = {r: holdings_of_layout(layout, master_dtype)
                for r, layout in enumerate(layouts)}
    return (holdings, {i.rank: i.pipeline for i in rank_map.ranks}, {i.rank: i.node for i in rank_map.ranks})


def snapshot_bytes(plan: Plan, model: ModelSpec, node_gpu: dict[str, str], *, num_peers: int = NUM_PEERS,
                   master_dtype=torch.float32) -> SnapshotBytes:
    """Per-step snapshot bytes of every rank under `plan` (node_gpu: node -> GPU type of the nodes alive)."""
    holdings, pipeline_of, rank_nodes = plan_holdings(plan, model, master_dtype)
    tiled = tiling_holdings(holdings, pipeline_of)
    placed = place_copies(tiled, rank_nodes, node_gpu, copies=1 + min(num_peers, len(node_gpu) - 1))
    size = {(name, chunk): nbytes for items in holdings.values() for name, chunk, nbytes in items}
    copied, written, owned = {}, {}, {}
    for rank in holdings:
        pushed = [item for items in placed.push[rank].values() for item in items]
        owned[rank] = placed.local[rank] | set(pushed) | placed.upload[rank]
        copied[rank] = sum(size[i] for i in owned[rank])
        written[rank] = sum(size[i] for i in placed.local[rank]) + sum(size[i] for i in pushed)
    unique = sum(size[i] for i in {(n, c) for items in tiled.values() for n, c, _ in items})
    return SnapshotBytes(unique=unique, held=sum(b for items in holdings.values() for _, _, b in items),
                         copied_max=max(copied.values()), copied_mean=sum(copied.values()) / len(copied),
                         written_max=max(written.values()), writing_ranks=sum(1 for b in copied.values() if b),
                         ranks=len(holdings), copied=copied, owned=owned)


def with_snapshot_bytes(plans, cluster, pools, model, say) -> None:
    """Each planned state saved with its plan gets the bytes its busiest GPU snapshots per step (computed with
    the runtime's own writer assignment: spot_replay_snapshot.py)."""
    todo = [p for p in plans.plans.values() if p.plan is not None and p.snapshot_bytes_per_gpu is None]
    if not todo:
        return
    start = time.perf_counter()
    for planned in todo:
        plan = plan_from_dict(planned.plan)
        node_gpu = {n.name: n.device for n in sub_cluster(cluster, pools, planned.state).nodes}
        busiest = snapshot_bytes(plan, model, node_gpu).busiest
        plans.plans[planned.state] = replace(planned, snapshot_bytes_per_gpu=float(busiest))
    say(f"snapshot bytes of {len(todo)} plans in {time.perf_counter() - start:.1f} s")
