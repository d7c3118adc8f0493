"""The built-in PyTorch model: its config, DDP ranks, warm pools' workers, checkpoints and rows."""
