"""planner: offline communication scheduling for data-parallel DNN training.

Ingest traces -> OpGraph + Trace -> TimeOracle -> schedule (TicTac, Caramel) ->
metrics / simulation -> export. Every stage is a plain function over dataclasses.
"""

__version__ = "0.1.0"
