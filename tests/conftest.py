import pathlib
import sys

# tests/exhaustive.py (the brute-force planner reference) is imported by tests and benchmarks
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
