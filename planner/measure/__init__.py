"""Per-rank analysis of a traced job: scheduling efficiency and bounds (`metrics`), what
the input holds (`inspection`) and the all-reduce overlap figures (`allreduce`)."""
