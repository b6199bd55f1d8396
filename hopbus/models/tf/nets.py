"""The Keras networks and their adapter to the Model protocol.

Parameters are the Keras model's weights as ``"layer/kernel"``-named float32 arrays. They are
drawn in numpy from the seed (He-uniform kernels, zero biases), not by Keras's initializers, so
p0 is the same on every worker whatever TensorFlow version or device each one runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hopbus.models.base import Params
from hopbus.models.tf.runtime import import_tf

EVAL_CHUNK = 512
"""Rows per evaluation pass: VGG's first activations are 256 KiB per 32x32 image."""

VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
"""Configuration A of Simonyan & Zisserman, without batch norm: 8 conv layers, 5 poolings."""


def _layers(keras: Any, name: str, n_classes: int) -> list[Any]:
    """The layers of ``name``; convolutions keep the size ("same"), poolings halve it (rounding
    up, so 8x8 digits survive VGG's five)."""
    conv = keras.layers.Conv2D
    pool = keras.layers.MaxPooling2D
    if name == "cnn":
        return [
            conv(16, 3, padding="same", activation="relu", name="conv1"),
            pool(2, padding="same", name="pool1"),
            conv(32, 3, padding="same", activation="relu", name="conv2"),
            pool(2, padding="same", name="pool2"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(64, activation="relu", name="fc1"),
            keras.layers.Dense(n_classes, name="fc2"),
        ]
    layers: list[Any] = []
    n_conv = n_pool = 0
    for item in VGG11:
        if item == "M":
            n_pool += 1
            layers.append(pool(2, padding="same", name=f"pool{n_pool}"))
        else:
            n_conv += 1
            layers.append(conv(item, 3, padding="same", activation="relu", name=f"conv{n_conv}"))
    # the classifier commonly used for CIFAR: the 512 features of the last 1x1 map, one layer
    layers += [keras.layers.Flatten(name="flatten"), keras.layers.Dense(n_classes, name="fc")]
    return layers


def network(keras: Any, name: str, shape: tuple[int, ...], n_classes: int) -> Any:
    """The Keras network ``name`` (cnn, vgg11) for images of ``shape``, not compiled: what the
    built-in models train, and what benchmarks/keras_overhead.py fits."""
    return keras.Sequential([keras.Input(shape), *_layers(keras, name, n_classes)], name=name)


class KerasModel:
    """A Keras network as a Model: the protocol's pure functions over the network's variables
    (``loss_and_grad`` assigns the params to them, then differentiates with a GradientTape)."""

    def __init__(
        self,
        name: str,
        shape: tuple[int, int, int],
        channel_major: bool,
        n_classes: int,
        device: str = "auto",
    ) -> None:
        self.name = name
        self.shape = shape
        self.channel_major = channel_major
        self.n_classes = n_classes
        self.requested_device = device
        self.device: str | None = None  # the device used, known once TensorFlow is loaded
        self._net: Any = None

    # -- the network, built on first use ----------------------------------------------------------
    def _build(self) -> None:
        if self._net is not None:
            return
        tf, self.device = import_tf(self.requested_device, f"--model {self.name}")
        keras = tf.keras
        net = network(keras, self.name, self.shape, self.n_classes)
        self._variables = [v for layer in net.layers for v in layer.trainable_weights]
        self._names = [
            f"{layer.name}/{v.name.rpartition('/')[2]}"
            for layer in net.layers
            for v in layer.trainable_weights
        ]
        params = [tf.TensorSpec(v.shape, tf.float32) for v in self._variables]
        h, w, c = self.shape
        images = tf.TensorSpec([None, h * w * c], tf.float32)
        labels = tf.TensorSpec([None], tf.int64)

        def logits_of(x: Any) -> Any:
            if self.channel_major:
                return net(tf.transpose(tf.reshape(x, [-1, c, h, w]), [0, 2, 3, 1]))
            return net(tf.reshape(x, [-1, h, w, c]))

        # fixed signatures: one trace each, whatever the batch size
        @tf.function(input_signature=[params, images, labels])
        def loss_and_grad(values: list[Any], x: Any, y: Any) -> Any:
            for var, value in zip(self._variables, values, strict=True):
                var.assign(value)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits_of(x))
                )
            return loss, tape.gradient(loss, self._variables)

        @tf.function(input_signature=[params, images, labels])
        def stats(values: list[Any], x: Any, y: Any) -> Any:
            for var, value in zip(self._variables, values, strict=True):
                var.assign(value)
            logits = logits_of(x)
            loss_sum = tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
            correct = tf.reduce_sum(tf.cast(tf.argmax(logits, axis=1) == y, tf.int64))
            return loss_sum, correct

        self._tf = tf
        self._loss_and_grad = loss_and_grad
        self._stats = stats
        self._net = net

    def _values(self, params: Params) -> list[np.ndarray]:
        return [np.asarray(params[n], dtype=np.float32) for n in self._names]

    # -- the Model protocol -----------------------------------------------------------------------
    def init_params(self, seed: int) -> Params:
        """He-uniform kernels (limit sqrt(6 / fan_in)) from ``seed``, zero biases."""
        self._build()
        rng = np.random.default_rng(seed)
        params: Params = {}
        for name, var in zip(self._names, self._variables, strict=True):
            shape = tuple(var.shape)
            if name.endswith("/kernel"):
                limit = np.sqrt(6.0 / int(np.prod(shape[:-1])))
                params[name] = rng.uniform(-limit, limit, shape).astype(np.float32)
            else:
                params[name] = np.zeros(shape, np.float32)
        return params

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
        """Mean cross-entropy and its gradient (computed in float32, returned in params' dtype)."""
        self._build()
        loss, grads = self._loss_and_grad(
            self._values(params), np.asarray(x, np.float32), np.asarray(y, np.int64)
        )
        return float(loss), {
            n: g.numpy().astype(params[n].dtype, copy=False)
            for n, g in zip(self._names, grads, strict=True)
        }

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and accuracy, ``EVAL_CHUNK`` rows per pass."""
        self._build()
        if len(y) == 0:
            return 0.0, 0.0
        values = self._values(params)
        total, correct = 0.0, 0
        for start in range(0, len(y), EVAL_CHUNK):
            loss_sum, n_correct = self._stats(
                values,
                np.asarray(x[start : start + EVAL_CHUNK], np.float32),
                np.asarray(y[start : start + EVAL_CHUNK], np.int64),
            )
            total += float(loss_sum)
            correct += int(n_correct)
        return total / len(y), correct / len(y)
