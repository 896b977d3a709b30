"""The `planner` command line (installed as the import package planner_cli)."""
