"""Training: optimizer and schedule, label-smoothed loss, divergence guard, orbax
checkpoints (with the data position), the ahead-of-time plan, and the loop in `train.py`."""
