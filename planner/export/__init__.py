"""Writers for the files the planner hands to users and to the enforcement side."""
