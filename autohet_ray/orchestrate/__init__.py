"""Ray glue: discovery, profiling on Ray, the worker actors, the one controller, sessions and Ray Train glue.
Import the submodules (`orchestrate.controller`, `orchestrate.worker`, ...) directly."""
