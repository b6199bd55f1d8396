"""Models by name, as the command line and config files spell them."""

from __future__ import annotations

from hopbus.errors import ConfigError
from hopbus.models.base import Model
from hopbus.models.linear import LogReg, Softmax
from hopbus.models.mlp import MLP

MODELS = ("logreg", "softmax", "mlp")


def build_model(name: str, n_features: int, n_classes: int, *, hidden: int = 64) -> Model:
    """The model called ``name`` for inputs of ``n_features`` and ``n_classes`` labels."""
    if n_features < 1:
        raise ConfigError(f"model {name!r}: the data needs at least 1 feature, got {n_features}")
    if n_classes < 2:
        raise ConfigError(f"model {name!r}: the data needs at least 2 classes, got {n_classes}")
    if name == "logreg":
        if n_classes != 2:
            raise ConfigError(
                f"model 'logreg' is binary but the data has {n_classes} classes; "
                "use the softmax model for more than 2"
            )
        return LogReg(n_features)
    if name == "softmax":
        return Softmax(n_features, n_classes)
    if name == "mlp":
        if hidden < 1:
            raise ConfigError(f"model 'mlp': hidden units must be at least 1, got {hidden}")
        return MLP(n_features, n_classes, hidden)
    raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
