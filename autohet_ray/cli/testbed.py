"""`autohet testbed up FILE | down | status | env | run FILE -- CMD... | vanish NODE`: a heterogeneous cluster of CPU shares and
shaped links on this machine (autohet_ray/testbed/). `run` brings it up, runs CMD as the driver in the head's
network namespace (RAY_ADDRESS and the rest set), and takes it down on every exit path."""
from __future__ import annotations

import json

from autohet_ray.testbed import bed
from autohet_ray.testbed.host import check_host
from autohet_ray.testbed.spec import load_testbed


def add_testbed_parser(sub) -> None:
    t = sub.add_parser("testbed", help="a heterogeneous cluster on this machine: CPU shares as devices, shaped "
                                       "links between network namespaces, one raylet per node (needs root)")
    cmds = t.add_subparsers(dest="testbed_command", required=True)
    u = cmds.add_parser("up", help="bring a testbed up from its file (takes down what a crashed run left first)")
    u.add_argument("file", help="the testbed file, e.g. jobs/testbeds/smallest.yaml (default: none, required)")
    u.add_argument("--check", action="store_true", help="only read the file and check this host; start nothing "
                                                        "(default: bring it up)")
    cmds.add_parser("down", help="remove every namespace, veth, qdisc, cgroup and process of the testbed")
    cmds.add_parser("status", help="what of the testbed is on this host (JSON)")
    cmds.add_parser("env", help="the driver's environment (NAME=VALUE lines): Ray address, token, gloo interface")
    r = cmds.add_parser("run", help="up, run CMD in the head's namespace as the driver, down on every exit path")
    r.add_argument("file", help="the testbed file, e.g. jobs/testbeds/smallest.yaml (default: none, required)")
    r.add_argument("cmd", nargs="+", help="the driver command, after -- (default: none, required)")
    v = cmds.add_parser("vanish", help="freeze every process of a node and take its link down")
    v.add_argument("node", help="the testbed node's name, as in its file (default: none, required)")


def cmd_testbed(args) -> int:
    if args.testbed_command == "down":
        bed.down()
        return 0
    if args.testbed_command == "status":
        print(json.dumps(bed.leftovers()))
        return 0
    if args.testbed_command == "env":
        print(" ".join(f"{k}={v}" for k, v in bed.driver_env().items()))
        return 0
    if args.testbed_command == "vanish":
        bed.vanish(args.node)
        print(f"node {args.node} vanished (frozen, link down)")
        return 0
    testbed = load_testbed(args.file)          # a bad file fails here, before anything starts
    if args.testbed_command == "run":
        return bed.run(testbed, args.cmd)
    check_host()
    if args.check:
        print(f"testbed {testbed.name}: {len(testbed.nodes)} nodes, {testbed.total_share:.3f} of "
              f"{testbed.cores - testbed.reserve_cores:.3f} cores; this host can run it")
        return 0
    try:
        state = bed.up(testbed)
    except BaseException:
        bed.down()
        raise
    print(f"testbed {testbed.name} up: Ray at {state['address']} (namespace {bed.HEAD_NS}), S3 at "
          f"{state['s3_endpoint']}; drive it with: ip netns exec {bed.HEAD_NS} env $(autohet testbed env) ...; "
          f"autohet testbed down removes it")
    return 0
