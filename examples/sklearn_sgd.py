"""Tune your own model: a scikit-learn ``SGDClassifier`` on the digits data, trained epoch by epoch.

One resource unit is one epoch (``partial_fit`` over the shuffled training set). A promoted trial
resumes from its checkpoint: the pickled model of its previous rung, so it trains only the epochs
from ``trial.start + 1`` to ``trial.resource`` (the epoch order is seeded by the epoch number, so
3 epochs then 6 more equal 9 at once). Run it with::

    hyperband tune --trainer examples/sklearn_sgd.py:train --space examples/sklearn_space.yaml \\
        --metric val_loss --direction minimize --min-resource 1 --max-resource 9 --eta 3

or from Python: ``hb.tune(train, space="examples/sklearn_space.yaml", metric="val_loss",
direction="minimize", max_resource=9)``.
"""

from __future__ import annotations

import pickle
from functools import lru_cache
from pathlib import Path

import numpy as np

import prefect_hyperband as hb


@lru_cache(maxsize=1)
def data():
    """Digits (shipped with scikit-learn), a seeded stratified split, standardised on the training part."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.25, stratify=y, random_state=0)
    scaler = StandardScaler().fit(X_train)
    return scaler.transform(X_train), scaler.transform(X_val), y_train, y_val, np.unique(y)


def train(trial: hb.Trial) -> dict[str, float]:
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import accuracy_score, log_loss

    X_train, X_val, y_train, y_val, classes = data()
    if trial.checkpoint:  # a promotion: continue the model of the previous rung
        with open(Path(trial.checkpoint) / "model.pkl", "rb") as fh:
            model = pickle.load(fh)
    else:
        c = trial.config
        model = SGDClassifier(loss="log_loss", alpha=c["alpha"], learning_rate=c["learning_rate"], eta0=c["eta0"],
                              random_state=0)
    metrics: dict[str, float] = {}
    for epoch in range(trial.start + 1, trial.resource + 1):
        order = np.random.default_rng(epoch).permutation(len(y_train))
        model.partial_fit(X_train[order], y_train[order], classes=classes)
        proba = model.predict_proba(X_val)
        metrics = {"val_loss": log_loss(y_val, proba, labels=classes), "val_accuracy": accuracy_score(y_val, model.predict(X_val))}
        trial.report(epoch, **metrics)  # one point per epoch on the trial's MLflow run
    with open(Path(trial.checkpoint_dir) / "model.pkl", "wb") as fh:
        pickle.dump(model, fh)
    return metrics


def log_model(checkpoint_dir: str, tags: dict[str, str] | None = None):
    """The champion in MLflow's scikit-learn flavour: the tuner calls this for the best trial, inside its run,
    and registers what it returns with alias ``champion``. Without it, the best checkpoint's files are logged.
    ``tags`` (optional in the signature) are the job's: passed on, the logged model is born with them."""
    import mlflow

    with open(Path(checkpoint_dir) / "model.pkl", "rb") as fh:
        model = pickle.load(fh)
    X_val = data()[1]
    signature = mlflow.models.infer_signature(X_val[:5], model.predict_proba(X_val[:5]))
    return mlflow.sklearn.log_model(model, name="model", signature=signature, input_example=X_val[:5], tags=tags)
