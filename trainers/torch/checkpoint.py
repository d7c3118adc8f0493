"""The torch trainer's checkpoints read back: the epochs one holds, its network for predictions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prefect_hyperband.trainers.base import checkpoint_resource
from prefect_hyperband.trainers.torch.models import Predictor, build_model


def read_checkpoint(checkpoint: str) -> dict[str, Any]:
    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"torch checkpoint {checkpoint} not found")
    return torch.load(checkpoint, map_location="cpu", weights_only=True)


def checkpoint_epochs(checkpoint: str) -> int:
    """Epochs a checkpoint holds: from its JSON sidecar, else from the checkpoint itself."""
    meta = Path(f"{checkpoint}.json")
    if meta.is_file():
        return checkpoint_resource(meta)
    return int(read_checkpoint(checkpoint)["epoch"])


def load_model(checkpoint: str) -> torch.nn.Module:
    """The checkpoint's network in eval mode: raw float32 rows (n, n_features) -> probabilities / values."""
    ck = read_checkpoint(checkpoint)
    model = build_model(ck["arch"])
    model.load_state_dict(ck["model"])
    std = ck["standardisation"]
    predictor = Predictor(model, ck["arch"]["task"], std["y_mean"], std["y_std"])
    return predictor.eval()


def predict(checkpoint: str, X: np.ndarray) -> np.ndarray:
    """Class probabilities (n, k), or values (n,) for regression, of raw feature rows."""
    return timed_predict(checkpoint, X)[0]


def timed_predict(checkpoint: str, X: np.ndarray) -> tuple[np.ndarray, float]:
    """``predict``, and the seconds the loaded model took for the rows (loading not counted)."""
    model = load_model(checkpoint)
    began = time.perf_counter()
    with torch.no_grad():
        out = model(torch.as_tensor(np.asarray(X, dtype=np.float32)))
    return out.double().numpy(), time.perf_counter() - began


__all__ = ["checkpoint_epochs", "load_model", "predict", "read_checkpoint", "timed_predict"]
