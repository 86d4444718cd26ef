"""Bring a testbed up and take it down.

Layout (every name starts with PREFIX):
- network namespace `ahtb-sw` holds a bridge `br0`; every other namespace has one veth `tb0` whose peer is a port
  of that bridge. A node's veth is shaped with `tbf` at its NIC rate in both directions (its own end: what it
  sends; the bridge's end: what it receives); the S3 namespace's at the storage rate; the head's is not shaped.
- `ahtb-head` (198.18.0.1) runs the Ray head (GCS, no devices) and the driver; `ahtb-s3` (198.18.0.2) a moto S3
  server; `ahtb-n-<node>` (198.18.0.10 + i) one `ray start` per node, offering its devices as Ray GPUs.
- cgroup v1 `freezer` `ahtb/<namespace>` holds every process started in a namespace (so a node can vanish, and
  `down` finds every process); cgroup v1 `cpu` `ahtb/<node>/dev<i>` caps device i's worker at its share.
Intra-node traffic is between addresses of one namespace and never reaches a veth.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

from autohet_ray.cluster.labels import gpu_resource
from autohet_ray.testbed.host import (CPU_ROOT, FREEZER_ROOT, NODE_STORE_ROOT, PREFIX, STATE_DIR, cgroup_pids, enter_ns,
                                      check_host, our_namespaces, remove_cgroup_tree, sh, write)
from autohet_ray.testbed.spec import CFS_PERIOD_US, Testbed, parse_testbed

log = logging.getLogger(__name__)

SWITCH_NS, HEAD_NS, S3_NS = f"{PREFIX}-sw", f"{PREFIX}-head", f"{PREFIX}-s3"
IFNAME = "tb0"                     # every namespace's veth has this name inside it (GLOO_SOCKET_IFNAME)
HEAD_IP, S3_IP = "198.18.0.1", "198.18.0.2"
RAY_PORT, S3_PORT = 6379, 9000     # inside their own namespaces: no other Ray cluster on this host can collide
RAY_TEMP_DIR = os.path.join(STATE_DIR, "ray")
TOKEN_PATH = os.path.join(STATE_DIR, "auth_token")
STATE_PATH = os.path.join(STATE_DIR, "state.json")
CLUSTER_PATH = os.path.join(STATE_DIR, "cluster.json")   # the product's cluster file of the testbed
LOG_DIR = f"/tmp/{PREFIX}-logs"    # the `ray start` and S3 server output of the last run (kept by `down`)
BUCKET = "autohet"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1"}
# Ray's health checks of the testbed: a frozen raylet is declared dead after ~10 s (the controller's own raylet
# probes notice it sooner: --loss-grace-s)
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 10,
                 "health_check_initial_delay_ms": 1000}
OBJECT_STORE_BYTES = 256 << 20


def node_ns(name: str) -> str:
    return f"{PREFIX}-n-{name}"


def node_ip(index: int) -> str:
    return f"198.18.0.{10 + index}"


def ray_address() -> str:
    return f"{HEAD_IP}:{RAY_PORT}"


def s3_endpoint() -> str:
    return f"http://{S3_IP}:{S3_PORT}"


def driver_env() -> dict:
    """The environment of every process of the testbed: its Ray cluster (token auth with its own token), gloo
    over the namespace's veth, its S3 server, and its node stores."""
    return {"RAY_ADDRESS": ray_address(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": TOKEN_PATH,
            "GLOO_SOCKET_IFNAME": IFNAME, "AUTOHET_NODE_STORE": NODE_STORE_ROOT, "AUTOHET_TESTBED_S3": s3_endpoint(),
            "AUTOHET_TESTBED_STATE": STATE_PATH,
            "AUTOHET_TESTBED_CLUSTER": CLUSTER_PATH, "RAY_USAGE_STATS_ENABLED": "0", **S3_CREDENTIALS}


def _tbf(ns: str, dev: str, mbit: float, verb: str = "add") -> None:
    rate_Bps = mbit * 1e6 / 8
    burst = max(int(rate_Bps / 100), 32 << 10)           # 10 ms worth, at least 32 KiB (a GSO packet or two)
    sh("tc", "-n", ns, "qdisc", verb, "dev", dev, "root", "tbf", "rate", f"{mbit}mbit", "burst", str(burst),
       "latency", "200ms")


def _link(ns: str, index: int, ip: str, mbit: float | None) -> None:
    """Namespace `ns` with veth tb0 at `ip`, its peer port p<index> on the bridge; shaped both ways at `mbit`."""
    sh("ip", "netns", "add", ns)
    port = f"p{index}"
    sh("ip", "-n", SWITCH_NS, "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", ns)
    sh("ip", "-n", SWITCH_NS, "link", "set", port, "master", "br0", "up")
    sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", IFNAME)
    sh("ip", "-n", ns, "link", "set", IFNAME, "up")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    if mbit is not None:
        _tbf(ns, IFNAME, mbit)
        _tbf(SWITCH_NS, port, mbit)


def _freezer(name: str) -> str:
    path = os.path.join(FREEZER_ROOT, name)
    os.makedirs(path, exist_ok=True)
    return path


def _device_cgroups(node, index: int) -> str:
    """cpu cgroup ahtb/<node> with one child dev<i> per device, each capped at the device's share."""
    root = os.path.join(CPU_ROOT, node.name)
    for dev in range(node.count):
        path = os.path.join(root, f"dev{dev}")
        os.makedirs(path, exist_ok=True)
        write(os.path.join(path, "cpu.cfs_period_us"), CFS_PERIOD_US)
        write(os.path.join(path, "cpu.cfs_quota_us"), int(round(node.share * CFS_PERIOD_US)))
    return root


def spawn(ns: str, argv: list[str], *, env: dict, freezer: str, log: str | None) -> subprocess.Popen:
    """Start `argv` inside namespace `ns` and inside freezer cgroup `freezer` (its children stay there); its
    output to `log` (None: this terminal, and Ctrl-C reaches it)."""
    procs = [os.path.join(freezer, "cgroup.procs"), os.path.join(CPU_ROOT, "sys", "cgroup.procs")]

    def enter():
        for path in procs:
            write(path, os.getpid())
    if log is None:
        return subprocess.Popen([*enter_ns(ns), *argv], env=os.environ | env, preexec_fn=enter)
    with open(log, "ab") as out:
        return subprocess.Popen([*enter_ns(ns), *argv], env=os.environ | env, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=enter, start_new_session=True)


def _ray_bin() -> str:
    return os.path.join(os.path.dirname(sys.executable), "ray")


def _ray_start(ns: str, argv: list[str], env: dict, log: str) -> subprocess.Popen:
    return spawn(ns, [_ray_bin(), "start", "--temp-dir", RAY_TEMP_DIR, "--disable-usage-stats",
                      "--include-log-monitor=false", "--object-store-memory", str(OBJECT_STORE_BYTES), *argv],
                 env=env, freezer=_freezer(ns), log=log)


def _start_node(ns: str, argv: list[str], env: dict, what: str, timeout_s: float, tries: int = 3) -> None:
    """`ray start` in `ns`, again (after killing what the try left) when it fails: under load a raylet can miss
    `ray start`'s fixed 30 s registration window."""
    log = os.path.join(LOG_DIR, f"{ns}.log")
    for attempt in range(tries):
        rc = _ray_start(ns, argv, env, log).wait(timeout=timeout_s)
        if rc == 0:
            return
        left = cgroup_pids(_freezer(ns))
        _signal(left, signal.SIGKILL)
        _wait_gone(left, 10)
    raise RuntimeError(f"testbed: {what} failed {tries} times (exit {rc}); see {log}")


def _wait_gone(pids, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)


def in_namespace(ns: str, code: str, *, timeout_s: float = 120.0) -> str:
    """Run Python `code` in namespace `ns` with the testbed's environment; its stdout."""
    out = subprocess.run([*enter_ns(ns), sys.executable, "-c", code], env=os.environ | driver_env(),
                         capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"testbed: in {ns}: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout


_WAIT_READY = """
import time, ray, boto3, botocore
deadline = time.time() + {timeout}
s3 = boto3.client("s3", endpoint_url={endpoint!r})
while True:
    try:
        s3.create_bucket(Bucket={bucket!r}); break
    except botocore.exceptions.EndpointConnectionError:
        if time.time() > deadline: raise
        time.sleep(0.2)
ray.init(address={address!r}, logging_level="ERROR")
while sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")) < {nodes}:
    assert time.time() < deadline, "testbed: not every raylet joined in time"
    time.sleep(0.2)
print("ready")
"""


def up(bed: Testbed, *, timeout_s: float = 90.0) -> dict:
    """Bring `bed` up (after a `down` of anything a crashed run left); returns the state written to STATE_PATH."""
    check_host()
    down(quiet=True)
    os.makedirs(STATE_DIR, exist_ok=True)
    shutil.rmtree(LOG_DIR, ignore_errors=True)
    os.makedirs(LOG_DIR)
    write(TOKEN_PATH, secrets.token_hex(32))
    os.chmod(TOKEN_PATH, 0o600)
    os.makedirs(os.path.join(CPU_ROOT, "sys"))         # Ray's own processes, the driver, S3: no quota
    write(os.path.join(CPU_ROOT, "cpu.shares"), bed.cpu_weight)
    sh("ip", "netns", "add", SWITCH_NS)
    sh("ip", "-n", SWITCH_NS, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", SWITCH_NS, "link", "set", "br0", "up")
    _link(HEAD_NS, 0, HEAD_IP, None)
    _link(S3_NS, 1, S3_IP, bed.storage_mbit)
    nodes = []
    for i, node in enumerate(bed.nodes):
        _link(node_ns(node.name), 10 + i, node_ip(i), node.nic_mbit)
        nodes.append({"name": node.name, "ns": node_ns(node.name), "ip": node_ip(i), "port": f"p{10 + i}",
                      "cpu_cgroup": _device_cgroups(node, i), "freezer": _freezer(node_ns(node.name))})
    state = {"testbed": bed.to_dict(), "cluster": bed.cluster_dict(), "address": ray_address(),
             "s3_endpoint": s3_endpoint(), "bucket": BUCKET, "nodes": nodes, "up_at": time.time()}
    write(STATE_PATH, json.dumps(state, indent=1))
    write(CLUSTER_PATH, json.dumps(state["cluster"], indent=1))
    env = driver_env()
    spawn(S3_NS, [sys.executable, "-m", "moto.server", "-H", S3_IP, "-p", str(S3_PORT)], env=env,
          freezer=_freezer(S3_NS), log=os.path.join(LOG_DIR, "s3.log"))
    _start_node(HEAD_NS, ["--head", "--node-ip-address", HEAD_IP, "--port", str(RAY_PORT), "--num-cpus", "1",
                          "--num-gpus", "0", "--include-dashboard=false", "--system-config", json.dumps(HEALTH_CHECKS)],
                env, "the Ray head", timeout_s)
    for node, info in zip(bed.nodes, nodes):       # one at a time: Ray's registration window is 30 s
        _start_raylet(bed, node, info, timeout_s)
    in_namespace(HEAD_NS, _WAIT_READY.format(timeout=timeout_s, endpoint=s3_endpoint(), bucket=BUCKET,
                                             address=ray_address(), nodes=len(bed.nodes)), timeout_s=timeout_s + 30)
    return state


def _start_raylet(bed: Testbed, node, info: dict, timeout_s: float) -> None:
    labels = {"ray.io/accelerator-type": node.device, "autohet.io/node": node.name,
              "autohet.io/emulated": "true", "autohet.io/testbed": bed.name}
    _start_node(info["ns"], [
        "--address", ray_address(), "--node-ip-address", info["ip"], "--num-cpus", "0",
        "--num-gpus", str(node.count), "--resources", json.dumps({gpu_resource(node.device): node.count}),
        "--labels", ",".join(f"{k}={v}" for k, v in labels.items())],
        driver_env() | {"AUTOHET_DEVICE_CGROUPS": info["cpu_cgroup"]}, f"ray start on node {node.name}", timeout_s)


def revive(name: str, timeout_s: float = 90.0) -> None:
    """A replacement for vanished node `name`: its frozen processes killed, its link up, a new raylet (a new
    Ray node id) in its namespace."""
    state = read_state()
    bed = parse_testbed(state["testbed"], cores=os.cpu_count())
    info = next(n for n in state["nodes"] if n["name"] == name)
    pids = cgroup_pids(info["freezer"])
    _signal(pids, signal.SIGKILL)
    write(os.path.join(info["freezer"], "freezer.state"), "THAWED")
    _wait_gone(pids, 10)
    sh("ip", "-n", SWITCH_NS, "link", "set", info["port"], "up")
    _start_raylet(bed, bed.node(name), info, timeout_s)


def set_storage_rate(mbit: float) -> None:
    """The S3 link's rate (both directions), changed in place."""
    for ns, dev in ((S3_NS, IFNAME), (SWITCH_NS, "p1")):
        _tbf(ns, dev, mbit, verb="change")


def drive(argv: list[str], *, timeout_s: float | None = None) -> subprocess.CompletedProcess:
    """Run `argv` as a driver in the head's namespace (the testbed's environment, its freezer cgroup); its
    stdout captured, its stderr passed through."""
    procs = os.path.join(_freezer(f"{HEAD_NS}-driver"), "cgroup.procs")
    return subprocess.run([*enter_ns(HEAD_NS), *argv], env=os.environ | driver_env(), stdout=subprocess.PIPE,
                          text=True, timeout=timeout_s, preexec_fn=lambda: write(procs, os.getpid()))


def read_state() -> dict:
    with open(os.environ.get("AUTOHET_TESTBED_STATE", STATE_PATH)) as f:
        return json.load(f)


def vanish(name: str) -> float:
    """Node `name` vanishes as a VM does: every process of it frozen (nothing exits, nothing refuses a
    connection), then its link taken down. Returns the time.time() it vanished."""
    node = next(n for n in read_state()["nodes"] if n["name"] == name)
    write(os.path.join(node["freezer"], "freezer.state"), "FROZEN")
    sh("ip", "-n", SWITCH_NS, "link", "set", node["port"], "down")
    return time.time()


def _ours_outside(pid: int) -> bool:
    return pid not in (os.getpid(), os.getppid())


def down(*, quiet: bool = False) -> dict:
    """Remove everything the testbed made, found by its prefix (safe after a crash, and when nothing is up):
    its processes (by freezer cgroup and by namespace), cgroups, namespaces (with their veths and qdiscs), the
    Ray temp dir and node stores. Returns what was removed."""
    namespaces = our_namespaces()
    pids = set(cgroup_pids(FREEZER_ROOT))
    for ns in namespaces:
        pids |= {int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()}
    pids = {p for p in pids if _ours_outside(p)}
    for dirpath, _dirs, files in os.walk(FREEZER_ROOT) if os.path.isdir(FREEZER_ROOT) else ():
        if "freezer.state" in files:
            write(os.path.join(dirpath, "freezer.state"), "THAWED")
    _signal(pids, signal.SIGTERM)
    _wait_gone(pids, 5)
    _signal({p for p in pids if _alive(p)}, signal.SIGKILL)
    deadline = time.time() + 10
    while time.time() < deadline and (cgroup_pids(FREEZER_ROOT) or cgroup_pids(CPU_ROOT)):
        time.sleep(0.1)
    for root in (CPU_ROOT, FREEZER_ROOT):
        remove_cgroup_tree(root)
    for ns in namespaces:
        sh("ip", "netns", "delete", ns, check=False)
    for path in (NODE_STORE_ROOT, STATE_DIR):
        shutil.rmtree(path, ignore_errors=True)
    removed = {"processes": len(pids), "namespaces": namespaces}
    if not quiet:
        log.info(f"testbed down: {len(pids)} processes, namespaces {namespaces or 'none'}, cgroups "
                 f"{CPU_ROOT} and {FREEZER_ROOT} removed")
    return removed


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def leftovers() -> dict:
    """What of the testbed is still on this host (empty lists: nothing): namespaces, links, cgroups, processes."""
    links = [line for line in sh("ip", "-o", "link", check=False).stdout.splitlines() if PREFIX in line]
    cgroups = [p for p in (CPU_ROOT, FREEZER_ROOT) if os.path.exists(p)]
    return {"namespaces": our_namespaces(), "links": links, "cgroups": cgroups,
            "processes": cgroup_pids(FREEZER_ROOT) if os.path.exists(FREEZER_ROOT) else []}


def run(bed: Testbed, argv: list[str]) -> int:
    """Bring `bed` up, run `argv` in the head's namespace (the driver: its freezer cgroup, the testbed's
    environment), and take the testbed down on every exit path (its exit code; 130 on Ctrl-C)."""
    try:
        up(bed)
        driver = spawn(HEAD_NS, argv, env=driver_env(), freezer=_freezer(f"{HEAD_NS}-driver"), log=None)
        return driver.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        down()

