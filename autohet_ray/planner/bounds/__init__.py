"""Proven lower bounds on every plan's iteration time (bound.py) and for each money goal (money_bound.py), solved with
cvxpy in a child process while the search runs (background.py)."""
