"""Protobuf messages (a read-only subset of TensorFlow's) that the planner parses."""
