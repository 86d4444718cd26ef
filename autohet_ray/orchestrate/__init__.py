"""Ray only here: discovery, emulated clusters, placement, profiling as Ray work, stage actors, the driver actor
and Ray Train glue. Import the submodules (`orchestrate.driver`, `orchestrate.emulation`, ...) directly."""
