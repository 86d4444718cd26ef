"""A real heterogeneous cluster on one machine: devices are CPU shares (cgroup v1 cpu quotas), links are
`tbf`-shaped veths between network namespaces, one `ray start` per namespace, S3 behind a shaped link, and a
node can vanish (cgroup freezer + link down). See docs/benchmarks.md#measured-on-a-heterogeneous-testbed."""
