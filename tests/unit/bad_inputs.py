"""The bad-input sweep's cases: every `autohet` command given malformed YAML/JSON files (whole-file junk, and
each field of a valid file replaced by a value of the wrong type, NaN, infinity or a negative number) and
malformed numeric flags. Every case must end with one line on stderr and exit code 2 (test_bad_input_sweep.py).

A case is (name, argv, files): `files` maps a path under the case's folder to its content (str, bytes, or
DIRECTORY); `{d}` in argv and paths is that folder, `{ok}` the folder of the valid inputs."""
from __future__ import annotations

import copy
import json

import yaml

from autohet_ray.model.spec import PRESETS

DIRECTORY = object()
NAN, INF = float("nan"), float("inf")
CLUSTER = {"name": "local-3", "nodes": [{"name": "a", "device": "H800", "count": 1, "nic_gbps": 100},
                                        {"name": "c", "device": "H20", "count": 2}],
           "network": {"inter_node_gbps": 200}}
MODEL = PRESETS["tiny-gpt"].to_dict()
PLAN = {"schema_version": 3, "model": "tiny-gpt", "model_spec": None, "cluster": "local-3", "global_batch": 4,
        "micro_batch": 1, "seq_len": 16, "schedule": "1f1b", "predicted": None,
        "pipelines": [{"num_microbatches": 4, "micro_batch": 1,
                       "stages": [{"layers": [0, 4], "tp": 1, "device_type": "H800", "node": "a",
                                   "devices": [0], "recompute": False}]}]}

# whole files that are no valid document of any kind
JUNK = {"empty": "", "blank": "\n\n", "null": "null\n", "number": "42\n", "string": "hello\n",
        "list": "[1, 2, 3]\n", "empty-map": "{}\n", "nan": ".nan\n", "bad-yaml": "a: [1,\n  b: }\n", "bad-json": '{"a": 1,',
        "binary": bytes(range(256)) * 4, "utf16": "name: x\n".encode("utf-16"), "tabs": "a:\n\t- 1\n"}


def bad_values(value) -> list:
    """Values of the wrong type (or out of range) for a field holding `value`."""
    if isinstance(value, bool):
        return ["yes-ish", 2, [], {}]
    if isinstance(value, (int, float)):
        return [NAN, INF, -INF, -1, "x", [], {}, True]
    if isinstance(value, str):
        return [[], {}, 5]
    if isinstance(value, list):
        return ["x", 5, {}, NAN]
    if isinstance(value, dict):
        return ["x", 5, [], NAN]
    return []


def field_paths(doc, prefix=()):
    """(path, value) of every field of a document, containers before their contents."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,), value
        yield from field_paths(value, prefix + (key,))


def mutated(doc, path, value):
    out = copy.deepcopy(doc)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def dump(doc, fmt: str) -> str:
    """JSON (NaN and Infinity as Python writes them) or YAML (.nan, .inf)."""
    return json.dumps(doc) if fmt == "json" else yaml.safe_dump(doc)


def document_cases(name: str, doc, fmt: str, exempt=()) -> list[tuple[str, object]]:
    """(case name, file content): the junk files, then each field of `doc` given each bad value."""
    out = [(f"{name}:{k}", v) for k, v in JUNK.items()]
    for path, value in field_paths(doc):
        if any(path[:len(e)] == e for e in exempt):
            continue
        for bad in bad_values(value):
            out.append((f"{name}:{'.'.join(map(str, path))}={bad!r}", dump(mutated(doc, path, bad), fmt)))
    return out
