"""The job's fleet through Ray's public autoscaler SDK (`ray.autoscaler.sdk.request_resources`): what to ask for
is job/fleet.py's; this asks, waits for the first nodes, and re-asks after each plan. The request stands until
replaced, so a reclaimed node's replacement is launched by the autoscaler while the job trains on the rest."""
from __future__ import annotations

import logging
import time

from ray.autoscaler.sdk import request_resources

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster
from autohet_ray.job.fleet import fleet_bundles, fleet_ready, initial_counts, next_counts, nodes_by_type

POLL_S = 0.5
log = logging.getLogger(__name__)


class Fleet:
    def __init__(self, cluster: Cluster):
        self.types = cluster.types
        self.counts: dict[str, int] | None = None     # the standing request, per type
        self.events: list[dict] = []                  # every request made: {"at", "counts"}

    def ask(self, counts: dict[str, int], *, why: str = "", again: bool = False) -> None:
        """Request these nodes per type (`again`: also when the standing request is the same)."""
        if counts == self.counts and not again:
            return
        bundles, selectors = fleet_bundles(self.types, counts)
        request_resources(bundles=bundles, bundle_label_selectors=selectors)
        self.counts = dict(counts)
        self.events.append({"at": time.time(), "counts": dict(counts), "why": why})
        log.info(f"autohet: asked the autoscaler for {', '.join(f'{n}x {t}' for t, n in counts.items())}"
                 f"{f' ({why})' if why else ''}")

    def start(self, discover, wait_s: float) -> None:
        """Ask for each type's max and wait (up to `wait_s`) until discover() (a Discovered) holds them."""
        self.ask(initial_counts(self.types), why="the job's start")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                if fleet_ready(self.types, self.counts, nodes_by_type(discover().cluster)):
                    return
            except ConfigError:       # no live node matches a type yet
                pass
            time.sleep(POLL_S)

    def after_plan(self, cluster: Cluster, plan_nodes: set[str], *, lost: bool = False) -> None:
        """Re-ask once a plan runs on `cluster` (the live nodes found), using the nodes in `plan_nodes`; after a
        loss (`lost`) the standing request is sent again: it names the lost node's replacement."""
        live, used = nodes_by_type(cluster), nodes_by_type(cluster, plan_nodes)
        counts = next_counts(self.types, self.counts, live, used)
        why = "a replacement for the lost node(s)" if lost else (
            "nodes the plan leaves idle given back" if any(counts[t] < self.counts[t] for t in counts) else "")
        self.ask(counts, why=why, again=lost)
