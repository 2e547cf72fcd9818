"""estimator: what one training step of a PyTorch model costs, before you train."""
