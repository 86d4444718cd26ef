"""The elastic job: plain data that travels in every manifest (so `autohet resume` can restart the job from its
storage alone), plus small pure helpers of the recovery controller."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from autohet_ray import ConfigError
from autohet_ray.config_io import dataclass_from_dict
from autohet_ray.cluster.spec import Cluster
from autohet_ray.plan.schedule import schedule_choices
from autohet_ray.plan.validate import check_micro_batch

RESTORE_MODES = ("local_first", "cloud_only")
DTYPES = ("float32", "float64")


@dataclass(frozen=True, kw_only=True)
class ElasticJob:
    model: dict
    """ModelSpec fields of the model to train."""
    cluster: dict
    """Cluster file contents; every node must be a live Ray node labelled autohet.io/node=<name>."""
    global_batch: int
    """Samples per step."""
    storage: dict
    """Cloud tier spec (see elastic_tiers.storage_spec): a directory or S3, optionally throttled."""
    seq_len: int | None = None
    """Tokens per sample (default: the model's max_seq_len)."""
    micro_batch: int | None = None
    """Fix the planner's micro-batch size."""
    schedule: str = "auto"
    """Pipeline schedule: "auto" (the faster that fits), "1f1b" or "zb-h1"; re-plans keep the choice."""
    plan: dict | None = None
    """The plan of the first launch (default: plan now); every re-plan uses the planner on the live nodes."""
    checkpoint: bool = True
    """Snapshot every step to the node keeper and a peer keeper (False: no checkpoints at all)."""
    cloud_every: int = 10
    """Upload to the cloud tier every this many steps (0: never)."""
    num_peers: int = 1
    """Peer keepers holding a replica of each rank's shards."""
    gc_every: int = 4
    """Delete keeper and cloud steps older than the newest two committed ones every this many steps."""
    seed: int = 0
    lr: float = 1e-3
    dtype: str = "float32"
    plan_time_limit_s: float = 5.0
    time_scale: float = 0.0
    """Emulated clock (emulated GPU nodes): wall seconds per emulated second; each op is stretched to the time
    the profile predicts for its device. 0: no pacing, compute runs at this machine's speed."""
    iteration_wall_s: float | None = None
    """Instead of time_scale: pick the scale at the first launch so one predicted iteration lasts this long."""
    collective_timeout_s: float = 60.0
    """torch.distributed timeout: a rank waiting on a vanished peer fails after at most this."""
    detect_timeout_s: float = 60.0
    """How long recovery waits for Ray to name the lost node or dead actor."""
    setup_timeout_s: float = 120.0

    def __post_init__(self):
        for name in ("global_batch",):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if self.micro_batch is not None:
            check_micro_batch(self.global_batch, self.micro_batch)
        for name in ("cloud_every", "gc_every", "num_peers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}; valid on CPU: {', '.join(DTYPES)}")
        schedule_choices(self.schedule)
        if not isinstance(self.storage, dict) or "kind" not in self.storage:
            raise ConfigError(f"storage={self.storage!r} must be a tier spec; build it with storage_spec(url)")

    def schedules(self) -> tuple[str, ...]:
        """The schedules the planner may choose from."""
        return schedule_choices(self.schedule)

    def to_dict(self) -> dict:
        return asdict(self)


def elastic_job_from_dict(raw: dict) -> ElasticJob:
    return dataclass_from_dict(ElasticJob, raw, "elastic job")


def without_nodes(cluster: Cluster, lost: list[str]) -> Cluster:
    """The cluster minus the lost nodes (ConfigError when nothing is left)."""
    kept = tuple(n for n in cluster.nodes if n.name not in set(lost))
    if not kept:
        raise ConfigError(f"every node of cluster {cluster.name!r} is lost ({sorted(lost)}); nothing to re-plan on")
    return replace(cluster, nodes=kept)


def plan_summary(plan) -> list[list[str]]:
    """Per pipeline, its stages as 'node:device xTP [start,end)'."""
    return [[f"{s.node}:{s.device_type}x{s.tp}[{s.layers[0]},{s.layers[1]})" for s in p.stages]
            for p in plan.pipelines]


def tier_order(rank_node: str, keeper_specs: dict[str, dict], cloud: dict, mode: str) -> list[dict]:
    """Read order for one rank, cheapest first: its node's keeper, the other keepers, then the cloud."""
    if mode not in RESTORE_MODES:
        raise ConfigError(f"restore mode {mode!r}; valid: {', '.join(RESTORE_MODES)}")
    if mode == "cloud_only":
        return [cloud]
    own = [keeper_specs[rank_node]] if rank_node in keeper_specs else []
    return own + [spec for node, spec in sorted(keeper_specs.items()) if node != rank_node] + [cloud]


def merge_restores(outs: list[dict]) -> dict:
    """One figure per phase over the ranks (they fetch in parallel: the slowest rank counts)."""
    by_tier: dict[str, int] = {}
    span: dict[str, float] = {}
    for out in outs:
        for tier, nbytes in out["bytes_by_tier"].items():
            by_tier[tier] = by_tier.get(tier, 0) + nbytes
        for tier, seconds in out["tier_read_s"].items():
            span[tier] = max(span.get(tier, 0.0), seconds)
    return {"fetch_s": max(o["fetch_s"] for o in outs), "load_s": max(o["load_s"] for o in outs),
            "bytes_by_tier": by_tier, "fetch_s_by_tier": span,
            "fallbacks": [f for o in outs for f in o["fallbacks"]][:10]}


def tiling_holdings(holdings: dict[int, list], rank_pipeline: dict[int, int]) -> dict[int, list]:
    """Keep, per tensor, only the holdings of one pipeline: pipelines may shard a tensor differently (TP2 in
    one, whole in another), and a step's chunks must tile each tensor exactly. The pipeline with the most
    distinct chunks wins (writes spread over more ranks), then the lowest index; other pipelines' ranks keep
    the chunks identical to its tiles (data-parallel copies, which can be written where they already are)."""
    chunks: dict[str, dict[int, set]] = {}
    for rank, items in holdings.items():
        for name, chunk, _ in items:
            chunks.setdefault(name, {}).setdefault(rank_pipeline[rank], set()).add(chunk)
    chosen = {name: min(by_pipe, key=lambda k: (-len(by_pipe[k]), k)) for name, by_pipe in chunks.items()}
    tiles = {name: chunks[name][k] for name, k in chosen.items()}
    return {rank: [item for item in items if item[1] in tiles[item[0]]] for rank, items in holdings.items()}
