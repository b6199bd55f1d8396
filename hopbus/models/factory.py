"""Models by name, as the command line and config files spell them."""

from __future__ import annotations

import sys
from typing import Any

from hopbus.errors import ConfigError
from hopbus.models.base import Model
from hopbus.models.custom import (
    built_keras,
    call_user,
    check_model,
    is_callable_spec,
    load_callable,
)
from hopbus.models.linear import LogReg, Softmax
from hopbus.models.mlp import MLP
from hopbus.models.tf import TF_MODELS, build_tf_model
from hopbus.models.tf.runtime import import_tf

MODELS = ("logreg", "softmax", "mlp")
"""The numpy models: any data set, no extra to install."""

ALL_MODELS = (*MODELS, *TF_MODELS)
"""Every --model: the numpy ones and the TensorFlow ones (image data, the tf extra)."""


def build_model(
    name: str,
    n_features: int,
    n_classes: int,
    *,
    hidden: int = 64,
    device: str = "auto",
    input_shape: tuple[int, ...] | None = None,
) -> Model | Any:
    """The model called ``name`` for inputs of ``n_features`` and ``n_classes`` labels.
    ``device`` places the TensorFlow models (auto|cpu|gpu|gpu:N); numpy runs on the CPU.
    ``MODULE:FUNCTION`` is a user's model (hopbus.models.custom): a numpy Model, or a compiled
    Keras model (built with ``device`` visible), with ``input_shape`` the shape of one sample."""
    if is_callable_spec(name):
        fn = load_callable(name, "--model")
        if "tensorflow" in sys.modules or "keras" in sys.modules:
            import_tf(device, f"--model {name}")  # --device, before the user's Keras code runs
        built = call_user(
            fn, name, "--model", n_features=n_features, n_classes=n_classes,
            input_shape=input_shape or (n_features,),
        )  # fmt: skip
        return built_keras(check_model(built, name), name, input_shape or (n_features,))
    if n_features < 1:
        raise ConfigError(f"model {name!r}: the data needs at least 1 feature, got {n_features}")
    if n_classes == 0:  # labels given as floats (hopbus/data/user.py): not classes
        raise ConfigError(
            f"model {name!r} classifies, but the data's labels are floats (targets of a "
            "regression?): give integer labels 0..C-1, or a --model of your own with a loss "
            "for them"
        )
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
    if name in TF_MODELS:
        return build_tf_model(name, n_features, n_classes, device)
    raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(ALL_MODELS)}")
