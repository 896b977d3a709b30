"""The shaped-network lab: planner's advice applied and measured on a tc-shaped loopback
inside a private network namespace (issue #44). Entry point: bench/lab/run.py."""
