"""TensorFlow/Keras models (the ``tf`` extra): a small CNN and VGG-11 for 32x32 images.

They follow the same Model protocol as the numpy models, their parameters the same flat dict of
named float32 arrays, so every scheme and the transport treat them alike. Importing this package
does not import TensorFlow: that waits for the first ``init_params`` (see ``runtime``).
"""

from __future__ import annotations

from hopbus.errors import ConfigError
from hopbus.models.base import Model
from hopbus.models.extras import require

TF_MODELS = ("cnn", "vgg11")

IMAGE_SHAPES: dict[int, tuple[tuple[int, int, int], bool]] = {
    64: ((8, 8, 1), False),  # digits
    784: ((28, 28, 1), False),  # MNIST-like
    3072: ((32, 32, 3), True),  # CIFAR-10, stored channel-major (3, 32, 32)
}
"""Feature count -> (height, width, channels), and whether rows are stored channel-major."""


def image_shape(name: str, n_features: int) -> tuple[tuple[int, int, int], bool]:
    """The image a row of ``n_features`` holds, or one ConfigError line naming the model."""
    if n_features not in IMAGE_SHAPES:
        known = ", ".join(f"{n} ({'x'.join(map(str, s))})" for n, (s, _) in IMAGE_SHAPES.items())
        raise ConfigError(
            f"model {name!r} needs images; {n_features} features is no known image size "
            f"(expected {known})"
        )
    return IMAGE_SHAPES[n_features]


def build_tf_model(name: str, n_features: int, n_classes: int, device: str) -> Model:
    """TF model ``name``; checks TensorFlow is installed (without importing it) and the shape."""
    shape, channel_major = image_shape(name, n_features)
    require("tensorflow", feature=f"--model {name}", package="TensorFlow", extra="tf", load=False)
    from hopbus.models.tf.nets import KerasModel

    return KerasModel(name, shape, channel_major, n_classes, device)


__all__ = ["IMAGE_SHAPES", "TF_MODELS", "build_tf_model", "image_shape"]
