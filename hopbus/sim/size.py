"""How many bytes an update of the run's model carries: what a simulated message is charged on
links with a bandwidth (``--slowdown link:MS/BW@I-J``, ``machines:...@MS/BW``).

A real worker's inbox charges each update the bytes of its parameters; the simulator has no
parameters, so it learns the snapshot's size from the run's ``--model`` and ``--data`` without
training anything: every model's parameters are counted from its layout (none is built: the
TensorFlow ones are counted layer by layer from their definition, without importing it),
and the data's shape is read from its spec (digits, synthetic, CIFAR-10) or from its files
(svmlight, a user's function). ``--message-bytes`` overrides all of it, in the simulator and
on the cluster alike.
"""

from __future__ import annotations

import math

from hopbus.config import RunConfig
from hopbus.errors import ConfigError

FLOAT32 = 4


def tf_parameters(name: str, shape: tuple[int, int, int], n_classes: int) -> int:
    """How many parameters TensorFlow model ``name`` (cnn, vgg11) has for images of ``shape``
    (height, width, channels): the layers of ``hopbus.models.tf.nets``, counted. 3x3
    convolutions that keep the size, 2x2 poolings that halve it rounding up, dense layers."""
    from hopbus.models.tf.nets import VGG11

    h, w, channels = shape
    total = 0

    def conv(out: int) -> None:
        nonlocal total, channels
        total += 3 * 3 * channels * out + out
        channels = out

    def pool() -> None:
        nonlocal h, w
        h, w = math.ceil(h / 2), math.ceil(w / 2)

    def dense(inputs: int, out: int) -> int:
        nonlocal total
        total += inputs * out + out
        return out

    if name == "cnn":
        conv(16)
        pool()
        conv(32)
        pool()
        dense(dense(h * w * channels, 64), n_classes)
        return total
    for item in VGG11:
        if item == "M":
            pool()
        else:
            conv(int(item))
    dense(h * w * channels, n_classes)
    return total


def _data_shape(cfg: RunConfig) -> tuple[int, int]:
    """(features per sample, classes) of the run's data, reading as little as it can."""
    kind, _, args = cfg.data.strip().partition(":")
    kind = kind.strip().lower()
    if kind == "synthetic":
        from hopbus.data.synthetic import parse_synthetic

        _, features, classes = parse_synthetic(args)
        return features, classes
    if kind == "cifar10":  # the folder is not needed to know the images' shape
        from hopbus.data.cifar10 import N_CLASSES, N_PIXELS

        return N_PIXELS, N_CLASSES
    from hopbus.data import load_dataset

    data = load_dataset(cfg.data, cfg.seed)  # digits (bundled, small), svmlight, a user's
    return data.n_features, data.n_classes


def snapshot_bytes(cfg: RunConfig) -> int:
    """The bytes of one update of ``cfg``'s model on its data: ``message_bytes`` when set, else
    its float32 parameters counted (as a real worker's inbox counts them)."""
    if cfg.message_bytes is not None:
        return cfg.message_bytes
    from hopbus.models import MODELS
    from hopbus.models.tf import TF_MODELS, image_shape

    if cfg.model not in (*MODELS, *TF_MODELS):
        raise ConfigError(
            f"the simulator does not build --model {cfg.model} to learn its snapshot's size "
            "for the links' bandwidth: give it with --message-bytes"
        )
    features, classes = _data_shape(cfg)
    if cfg.model in TF_MODELS:
        shape, _ = image_shape(cfg.model, features)
        return tf_parameters(cfg.model, shape, classes) * FLOAT32
    from hopbus.models import build_model

    build_model(cfg.model, features, classes, hidden=cfg.hidden)  # its checks (no weights yet)
    return numpy_parameters(cfg.model, features, classes, cfg.hidden) * FLOAT32


def numpy_parameters(name: str, features: int, classes: int, hidden: int) -> int:
    """How many parameters numpy model ``name`` has: its layout (hopbus/models/linear.py and
    mlp.py), counted. Building it to count them allocated every weight (--hidden 100000 on
    100,000 features asked for 75 GiB just to size a simulated message)."""
    if name == "logreg":  # w, b
        return features + 1
    if name == "softmax":  # W, b
        return features * classes + classes
    return features * hidden + hidden + hidden * classes + classes  # mlp: W1, b1, W2, b2
