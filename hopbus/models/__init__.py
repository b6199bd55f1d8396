"""Models trained by the workers: numpy with forward and backward written out by hand, and
TensorFlow/Keras image networks (``hopbus.models.tf``, the tf extra, imported only when used).

Parameters travel as :data:`Params`, an insertion-ordered ``dict`` of named float32 arrays.
They are IMMUTABLE by convention: no function here (or anywhere else) modifies an array of a
``Params`` in place; every update (``SGD.step``, a Reduce) returns new arrays. The transport
sends arrays zero-copy, so an in-place edit would corrupt a message still in flight.
"""

from hopbus.models.base import Model, Params
from hopbus.models.factory import ALL_MODELS, MODELS, build_model
from hopbus.models.optim import SGD

__all__ = ["ALL_MODELS", "MODELS", "SGD", "Model", "Params", "build_model"]
