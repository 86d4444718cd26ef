"""What a testbed needs of this host (root, network namespaces, `tbf`, cgroup v1 `cpu` and `freezer`), and the
commands it runs. Everything the testbed makes carries the prefix PREFIX, so `down` finds it after a crash."""
from __future__ import annotations

import os
import subprocess

from autohet_ray import ConfigError

PREFIX = "ahtb"
CPU_ROOT = f"/sys/fs/cgroup/cpu/{PREFIX}"
FREEZER_ROOT = f"/sys/fs/cgroup/freezer/{PREFIX}"
STATE_DIR = f"/tmp/{PREFIX}"                       # token, Ray's temp dir, logs, state.json
NODE_STORE_ROOT = f"/dev/shm/{PREFIX}-stores"      # the node stores of jobs on the testbed


class HostUnfit(ConfigError):
    """This host cannot run a testbed (not root, no netns, no cgroup controller, no tbf)."""


def sh(*args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run one command (no shell); a failure raises with its stderr (one line)."""
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip() or out.returncode}")
    return out


def enter_ns(ns: str) -> list[str]:
    """The command prefix that runs a program in network namespace `ns` only (`ip netns exec` would also remount
    /sys, hiding the cgroup controllers the testbed's workers join)."""
    return ["nsenter", f"--net=/run/netns/{ns}", "--"]


def check_host() -> None:
    """HostUnfit (one line saying what is missing) unless this host can run a testbed."""
    if os.geteuid() != 0:
        raise HostUnfit("the testbed needs root (network namespaces, tc, cgroups); run it as root")
    for path, what in ((CPU_ROOT, "cpu"), (FREEZER_ROOT, "freezer")):
        parent = os.path.dirname(path)
        if not os.access(parent, os.W_OK) or not os.path.exists(os.path.join(parent, "cgroup.procs")):
            raise HostUnfit(f"the testbed needs a writable cgroup v1 {what} controller at {parent}")
    if not os.path.exists(os.path.join(os.path.dirname(CPU_ROOT), "cpu.cfs_quota_us")):
        raise HostUnfit("the testbed needs CFS quotas (cpu.cfs_quota_us) in the cgroup v1 cpu controller")
    probe = f"{PREFIX}-probe"
    made = sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        raise HostUnfit(f"the testbed needs network namespaces (ip netns add failed: {made.stderr.strip()})")
    try:
        sh("ip", "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb")
        tbf = sh("tc", "-n", probe, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "1mbit", "burst", "16kb",
                 "latency", "50ms", check=False)
        if tbf.returncode != 0:
            raise HostUnfit(f"the testbed needs the tbf qdisc (tc said: {tbf.stderr.strip()})")
    finally:
        sh("ip", "netns", "delete", probe, check=False)


def write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def cgroup_pids(root: str) -> list[int]:
    """Every process in the cgroup `root` and below."""
    pids = []
    for dirpath, _dirs, files in os.walk(root):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(dirpath, "cgroup.procs")) as f:
                    pids += [int(x) for x in f.read().split()]
            except OSError:
                pass
    return pids


def remove_cgroup_tree(root: str) -> None:
    """rmdir the cgroup `root` and every cgroup below it, deepest first (each must hold no process)."""
    if not os.path.isdir(root):
        return
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda w: -w[0].count("/")):
        os.rmdir(dirpath)


def our_namespaces() -> list[str]:
    listed = sh("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.split() and line.split()[0].startswith(PREFIX + "-")]
