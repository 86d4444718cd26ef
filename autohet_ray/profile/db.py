"""Profile DB: per (device type, TP degree, micro-batch) and layer kind, the forward/backward seconds and the
memory of one TP rank; per link kind, bandwidth and latency. JSON on disk; `kind` says whether the figures
were measured on devices or derived analytically from the catalog.

Times are pure compute of one rank's shard. The TP collectives are priced by the cost model from the links,
except where an entry carries their measured cost (`tp_comm_*_s`, runtime/in_situ_cost.py); p2p always is.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from autohet_ray import ConfigError
from autohet_ray.config_io import (dataclass_from_dict, finite_number, mapping, read_structured, text_field,
                                    whole_number)

PROFILE_SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    fwd_s: float                 # one micro-batch forward, seconds
    bwd_s: float                 # one micro-batch backward (input + weight grads), seconds
    param_bytes: int             # parameters of this rank's shard, bytes in training dtype
    activation_bytes: int        # activations kept for backward, one micro-batch, bytes
    # seconds the TP collectives add to the forward / backward, measured in a real TP group; None: priced
    tp_comm_fwd_s: float | None = None
    tp_comm_bwd_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class LinkProfile:
    bandwidth_Bps: float         # bytes/s, one direction
    latency_s: float
    collective_overhead_s: float = 0.0   # fixed seconds a collective pays beyond its ring steps (profile/link_probe.py)
    # bytes/s of an all-reduce's ring steps where measured: gloo reduces on the host CPU, well below the p2p
    # rate; NCCL's stays near it. None: bandwidth_Bps
    allreduce_bandwidth_Bps: float | None = None


@dataclass(kw_only=True)
class ProfileDB:
    kind: str                                   # "analytic" or "measured"
    model: str
    seq_len: int
    entries: dict[tuple[str, int, int], dict[str, LayerProfile]] = field(default_factory=dict)
    links: dict[str, LinkProfile] = field(default_factory=dict)   # "intra:<device type>", "inter"
    # device type -> seconds per parameter of the runtime's update (norm, clip, AdamW), where measured
    optimizer_s_per_param: dict[str, float] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)   # software versions, host, date, ...

    def layer(self, device_type: str, tp: int, micro_batch: int, kind: str) -> LayerProfile:
        key = (device_type, tp, micro_batch)
        if key not in self.entries:
            have = sorted(self.entries)
            raise ConfigError(f"profile ({self.kind}) has no entry for device={device_type}, tp={tp}, "
                              f"micro_batch={micro_batch}; it has {have[:12]}{' ...' if len(have) > 12 else ''}")
        return self.entries[key][kind]

    def has(self, device_type: str, tp: int, micro_batch: int) -> bool:
        return (device_type, tp, micro_batch) in self.entries

    def link(self, name: str) -> LinkProfile | None:
        return self.links.get(name)

    def to_dict(self) -> dict:
        return {
            "schema_version": PROFILE_SCHEMA_VERSION, "kind": self.kind, "model": self.model,
            "seq_len": self.seq_len, "meta": self.meta,
            "entries": [{"device_type": d, "tp": t, "micro_batch": m,
                         "layers": {k: asdict(v) for k, v in layers.items()}}
                        for (d, t, m), layers in sorted(self.entries.items())],
            "links": {k: asdict(v) for k, v in sorted(self.links.items())},
            "optimizer_s_per_param": dict(sorted(self.optimizer_s_per_param.items())),
        }

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)


def profile_from_dict(raw) -> ProfileDB:
    """A ProfileDB from its JSON form; ConfigError naming the first field of the wrong type or range."""
    if not isinstance(raw, dict) or raw.get("schema_version") != PROFILE_SCHEMA_VERSION \
            or isinstance(raw.get("schema_version"), bool):
        raise ConfigError(f"profile: expected a JSON object with schema_version {PROFILE_SCHEMA_VERSION}")
    if raw.get("kind") not in ("analytic", "measured"):
        raise ConfigError(f"profile: kind={raw.get('kind')!r}; valid: analytic, measured")
    meta = mapping(raw.get("meta", {}), "profile: meta")
    if "dtype" in meta:
        text_field(meta["dtype"], "profile: meta.dtype")
    db = ProfileDB(kind=raw["kind"], model=text_field(raw.get("model"), "profile: model"),
                   seq_len=whole_number(raw.get("seq_len"), "profile: seq_len", minimum=1), meta=meta)
    entries = raw.get("entries")
    if not isinstance(entries, list):
        raise ConfigError(f"profile: entries={entries!r} must be a list")
    for k, e in enumerate(entries):
        where = f"profile: entries[{k}]"
        e = mapping(e, where)
        key = (text_field(e.get("device_type"), f"{where}.device_type"),
               whole_number(e.get("tp"), f"{where}.tp", minimum=1),
               whole_number(e.get("micro_batch"), f"{where}.micro_batch", minimum=1))
        layers = mapping(e.get("layers"), f"{where}.layers")
        db.entries[key] = {text_field(name, f"{where}.layers"): _measured(LayerProfile, v, f"{where}.layers.{name}")
                           for name, v in layers.items()}
    db.links = {text_field(k, "profile: links"): _measured(LinkProfile, v, f"profile: links.{k}")
                for k, v in mapping(raw.get("links", {}), "profile: links").items()}
    db.optimizer_s_per_param = {
        text_field(k, "profile: optimizer_s_per_param"): finite_number(v, f"profile: optimizer_s_per_param.{k}",
                                                                        minimum=0)
        for k, v in mapping(raw.get("optimizer_s_per_param", {}), "profile: optimizer_s_per_param").items()}
    return db


def _measured(cls, raw, where: str):
    """A LayerProfile or LinkProfile whose every figure is a finite number >= 0 (or an optional one unset)."""
    item = dataclass_from_dict(cls, mapping(raw, where), where)
    for name, value in asdict(item).items():
        if value is not None and "bandwidth" in name:
            finite_number(value, f"{where}.{name}", above=0)
        elif value is not None:
            finite_number(value, f"{where}.{name}", minimum=0)
    return item


def load_profile(path: str) -> ProfileDB:
    return profile_from_dict(read_structured(path, "profile"))
