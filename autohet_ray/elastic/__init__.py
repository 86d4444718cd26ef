"""Ray side of elastic training: node stores and their keepers, liveness, spot notices, commits, recovery."""
