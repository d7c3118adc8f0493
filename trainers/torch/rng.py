"""A rank's random number generators (torch, NumPy, Python's): saved in a checkpoint, restored, seeded per rank."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and plain types (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [int(version), [int(v) for v in internal], gauss],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_rank(seed: int, rank: int, epoch: int) -> None:
    """Per-rank seeds (dropout differs between replicas); ``epoch`` keeps a resumed-without-state run apart."""
    value = seed + rank + 1_000_003 * epoch
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)
