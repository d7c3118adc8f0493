"""PyTorch networks for the torch trainer: a small CNN for images, an MLP for tables.

Every network takes raw float32 feature rows of shape (n, n_features) (digits: the flat 64
pixels) and standardises them itself with buffers fitted on the training split, so a loaded
model needs nothing but the rows. No BatchNorm: per-replica batch statistics would break the
equivalence of world size k x batch b/k with world size 1 x batch b.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn


def fit_standardisation(X: np.ndarray, image: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and std of the training rows; images keep their 0..1 pixels as they are."""
    n_features = X.shape[1]
    if image:
        return torch.zeros(n_features), torch.ones(n_features)
    mean = X.astype(np.float64).mean(axis=0)
    std = X.astype(np.float64).std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)  # constant columns: leave them at 0 after centring
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)


def fit_target(y: np.ndarray, task: str) -> tuple[float, float]:
    """Mean and std of a regression target (trained on the standardised target); (0, 1) otherwise."""
    if task != "regression":
        return 0.0, 1.0
    std = float(np.std(y))
    return float(np.mean(y)), std if std > 1e-12 else 1.0


class ConvNet(nn.Module):
    """Two 3x3 conv layers of ``width`` channels, a 2x2 max-pool, dropout, a linear head."""

    def __init__(self, image_shape: tuple[int, int, int], width: int, dropout: float, n_outputs: int):
        super().__init__()
        channels, height, wide = image_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(width * (height // 2) * (wide // 2), n_outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MLP(nn.Module):
    """Two hidden ReLU layers of ``width`` units with dropout after each."""

    def __init__(self, n_features: int, width: int, dropout: float, n_outputs: int):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(n_features, width),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(width, n_outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class TorchModel(nn.Module):
    """Raw rows -> standardised -> (reshaped to images) -> network -> logits (or the standardised value)."""

    def __init__(self, arch: Mapping[str, Any]):
        super().__init__()
        n_features = int(arch["n_features"])
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        shape = arch.get("image_shape")
        self.image_shape = tuple(int(s) for s in shape) if shape else None
        if self.image_shape is not None and math.prod(self.image_shape) != n_features:
            raise ValueError(f"image shape {self.image_shape} does not hold {n_features} features")
        width, dropout, n_outputs = int(arch["width"]), float(arch["dropout"]), int(arch["n_outputs"])
        if self.image_shape is not None:
            self.net: nn.Module = ConvNet(self.image_shape, width, dropout, n_outputs)
        else:
            self.net = MLP(n_features, width, dropout, n_outputs)

    def set_standardisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean.copy_(mean)
        self.std.copy_(std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        if self.image_shape is not None:
            x = x.reshape(-1, *self.image_shape)
        return self.net(x)


class Predictor(nn.Module):
    """What a registered model serves: raw rows -> class probabilities (n, k), or values (n,) for regression."""

    def __init__(self, model: TorchModel, task: str, y_mean: float = 0.0, y_std: float = 1.0):
        super().__init__()
        self.model = model
        self.task = task
        self.y_mean = float(y_mean)
        self.y_std = float(y_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        if self.task == "regression":
            return out.squeeze(-1) * self.y_std + self.y_mean
        return torch.softmax(out, dim=-1)


def build_model(arch: Mapping[str, Any]) -> TorchModel:
    """The network an ``arch`` dict (as stored in a checkpoint) describes, freshly initialised."""
    return TorchModel(arch)


def loss_function(task: str) -> nn.Module:
    """Mean loss over the (per-replica) batch: cross-entropy on logits, or MSE on one output."""
    return nn.MSELoss() if task == "regression" else nn.CrossEntropyLoss()


def predictions(outputs: torch.Tensor, task: str, y_mean: float, y_std: float) -> np.ndarray:
    """Network outputs -> what ``trainers.data.score`` takes: probabilities, or values."""
    if task == "regression":
        return (outputs.squeeze(-1).double() * y_std + y_mean).numpy()
    return torch.softmax(outputs.double(), dim=-1).numpy()


def safe_score(metric: str, y_true: np.ndarray, prediction: np.ndarray) -> float:
    """``trainers.data.score``, or the worst value when training diverged (non-finite predictions).

    Accuracy and RMSE are computed here with the same formulas, which spares the rank the
    second it takes to import scikit-learn; other metrics go through ``score``.
    """
    if not np.all(np.isfinite(prediction)):
        return 0.0 if metric in ("auc", "accuracy") else math.inf
    if metric == "accuracy" and prediction.ndim == 2:
        return float(np.mean(prediction.argmax(axis=1) == y_true))
    if metric == "rmse":
        return float(np.sqrt(np.mean((np.asarray(y_true, dtype=np.float64) - prediction) ** 2)))
    from prefect_hyperband.trainers.data import score

    return score(metric, y_true, prediction)


def learning_rate(effective_lr: float, warmup_epochs: int, epoch: int, step: int, steps_per_epoch: int) -> float:
    """Linear warm-up per iteration over the first ``warmup_epochs`` (Goyal et al. 2017), constant after."""
    if warmup_epochs <= 0:
        return effective_lr
    done = epoch * steps_per_epoch + step + 1
    return effective_lr * min(1.0, done / (warmup_epochs * steps_per_epoch))
