"""Trainers: offline REINFORCE on aggregated rewards (``offline``); more to come."""
