"""Where a torch rank runs: its device (a GPU of its trial-rung's, else the CPU), its process group bound to it, and
torch's deterministic modes when the job asks (``--deterministic``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def device_for(local_rank: int) -> tuple[torch.device, str]:
    """Local rank k's device: ``cuda:k`` of the GPUs its trial-rung was given (``CUDA_VISIBLE_DEVICES``), else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def join(backend: str, device: torch.device, **options: Any) -> None:
    """The process group, bound to the rank's GPU where it has one (no "device under current context" guess at each
    barrier)."""
    if device.type == "cuda":
        options["device_id"] = device
    dist.init_process_group(backend, **options)


def set_deterministic(on: bool) -> None:
    """``--deterministic``: torch's deterministic algorithms and cuDNN's (``CUBLAS_WORKSPACE_CONFIG`` is the trainer's,
    in the environment); off, torch's defaults."""
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False


__all__ = ["device_for", "join", "set_deterministic"]
