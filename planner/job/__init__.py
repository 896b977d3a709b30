"""The job level: a job's analyses end to end (`analysis`), per rank on a pool or Dask
(`parallel`, `pipeline`, `rank_analysis`, `rank_replay`, `rank_store`) and the check of
an enforced run against its plan (`verify`)."""
