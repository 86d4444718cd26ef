"""A local cluster scaled by Ray's own autoscaler (v2), whose nodes are local processes that its fake multi-node
provider starts and stops (`ray.autoscaler._private.fake_multi_node`, the provider behind
`ray.cluster_utils.AutoscalingCluster`).

Not AutoscalingCluster itself: its start and shutdown run `ray stop --force`, which would stop every Ray cluster
of this user on the machine. Here the head runs `ray start --head --block` in a session of its own, with its own
temp dir and ports; every process of the cluster (the autoscaler's nodes too) stays in that session's process
group, which is killed by its id at the end. The provider is loaded as an `external` one because the wheel lacks
the `fake_multinode` type's defaults file (`example.yaml`).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import shutil
import socket
import subprocess
import tempfile
import sys
import time

BIN = os.path.dirname(sys.executable)
FAKE_HEAD_NODE_ID = "f" * 51 + "00000"        # the provider's ids: fff...00000 for the head, ...00001, ... after
PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 20000:          # Ray's worker ports default to 10002-19999
            return port


def autoscaler_config(worker_types: dict, gcs_address: str, *, head_cpus: int) -> dict:
    return {"cluster_name": "autohet-fleet-test", "max_workers": 8, "upscaling_speed": 1.0,
            "idle_timeout_minutes": 0.05,
            "provider": {"type": "external", "module": PROVIDER, "gcs_address": gcs_address,
                         "launch_multiple": True, "head_node_id": FAKE_HEAD_NODE_ID, "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True},
            "auth": {"ssh_user": "ubuntu"}, "docker": {}, "head_node_type": "ray.head.default",
            "available_node_types": {"ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {},
                                                          "max_workers": 0}, **worker_types},
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
            "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
            "worker_start_ray_commands": []}


@contextlib.contextmanager
def autoscaling_cluster(worker_types: dict, tmp_dir: str, *, head_cpus: int = 1, system_config: dict | None = None,
                        timeout_s: float = 180.0):
    """Start the head (no GPUs) with the autoscaler; yields (the GCS address once it answers, the process group id
    of the cluster's processes)."""
    gcs, dashboard, client, agent = free_port(), free_port(), free_port(), free_port()
    address = f"127.0.0.1:{gcs}"
    config_path = os.path.join(tmp_dir, "autoscaler.json")
    with open(config_path, "w") as f:
        json.dump(autoscaler_config(worker_types, address, head_cpus=head_cpus), f)
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1",
               RAY_enable_autoscaler_v2="1", RAY_CLOUD_INSTANCE_ID=FAKE_HEAD_NODE_ID,
               RAY_OVERRIDE_NODE_ID_FOR_TESTING=FAKE_HEAD_NODE_ID, RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    ray_dir = tempfile.mkdtemp(prefix="autohet-as-")     # short: Ray's socket paths must stay under 108 bytes
    cmd = [f"{BIN}/ray", "start", "--head", f"--port={gcs}", "--node-ip-address=127.0.0.1",
           f"--num-cpus={head_cpus}", "--num-gpus=0", f"--autoscaling-config={config_path}", f"--temp-dir={ray_dir}",
           "--include-dashboard=false", f"--dashboard-port={dashboard}", f"--ray-client-server-port={client}",
           f"--dashboard-agent-listen-port={agent}", "--block"]
    if system_config:
        cmd.append(f"--system-config={json.dumps(system_config, separators=(',', ':'))}")
    log = open(os.path.join(tmp_dir, "head.log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_gcs(address, proc, timeout_s)
        yield address, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)     # the autoscaler's nodes, started in this process group
        log.close()
        shutil.rmtree(ray_dir, ignore_errors=True)


def _wait_gcs(address: str, proc: subprocess.Popen, timeout_s: float) -> None:
    host, port = address.split(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "ray start --head exited early (see head.log)"
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.25)
    raise TimeoutError(f"the head's GCS at {address} did not answer in {timeout_s} s")


def _group_processes(pgid: int) -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process in process group `pgid`, from /proc."""
    rows = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()       # after "pid (comm)": state, ppid, pgrp, ...
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:                       # the process ended meanwhile
            continue
        if int(fields[2]) == pgid:
            rows.append((int(entry), int(fields[1]), args))
    return rows


def reclaim(node_id: str, head_pgid: int) -> list[int]:
    """End a node the way a spot reclaim does: SIGKILL its raylet, every process under it (workers, agents) and
    its log monitor, with no drain. Only processes of the head's process group (this cluster's) are touched. The
    killed pids."""
    rows = _group_processes(head_pgid)
    raylet = [(p, args) for p, _, args in rows if "raylet/raylet" in args and f"--node_id={node_id}" in args]
    assert len(raylet) == 1, f"no raylet process of node {node_id} in process group {head_pgid}"
    pid, args = raylet[0]
    suffix = args.split("--raylet_socket_name=")[1].split()[0].rsplit("/raylet", 1)[1]     # ".N" of this node
    doomed = {pid} | {p for p, _, a in rows if "log_monitor.py" in a and f"log_monitor{suffix}.out" in a}
    grew = True
    while grew:
        more = {p for p, pp, _ in rows if pp in doomed} - doomed
        doomed |= more
        grew = bool(more)
    for p in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return sorted(doomed)
