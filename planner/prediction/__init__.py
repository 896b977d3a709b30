"""Prediction: the discrete-event replay of a rank's DAG under a plan (`simulate`, its
compiled loop `_simkernel`), the host's shared cores (`host`) and the enforced
schedules (`enforced`)."""
