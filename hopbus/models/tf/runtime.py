"""The one function that imports TensorFlow: quiet, on the device the worker asked for.

TensorFlow is imported here and nowhere else, the first time a TF model is used (a worker's
``init_params``), so the numpy models and the launcher never pay its seconds of start-up.
"""

from __future__ import annotations

import logging
import os
import re
from types import ModuleType

from hopbus.errors import ConfigError
from hopbus.models.extras import load
from hopbus.models.quiet import native_notices_hidden

DEVICE_PATTERN = r"auto|cpu|gpu(:[0-9]+)?"
"""``--device``: auto (a GPU if TensorFlow sees one, else the CPU), cpu, gpu (the first), gpu:N."""

DEVICE_HELP = "expected auto, cpu, gpu or gpu:N"

_chosen: dict[str, str] = {}  # the --device asked -> the device used: one entry a process


def import_tf(device: str, feature: str) -> tuple[ModuleType, str]:
    """TensorFlow with only ``device`` visible, and that device's name ("cpu", "gpu:0").

    Visibility is set with ``tf.config.set_visible_devices`` rather than CUDA_VISIBLE_DEVICES:
    it can say how many GPUs there are when gpu:N names none, and works even when something
    else imported TensorFlow first. It can be set once per process, before any op runs: a
    worker is one process with one device.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # C++ banners (CUDA, XLA)
    # oneDNN stays on: turning it off (TF_ENABLE_ONEDNN_OPTS=0) silences one start-up notice
    # but makes VGG-11's CPU step 5x slower (0.69 s against 0.14 s per batch of 32 here)
    with native_notices_hidden():  # absl's and oneDNN's start-up lines, which the level misses
        tf = load("tensorflow", feature=feature, package="TensorFlow", extra="tf")
    tf.get_logger().setLevel(logging.ERROR)  # Python-side warnings (retracing, deprecations)
    logging.getLogger("absl").setLevel(logging.ERROR)
    if device not in _chosen:
        if _chosen:
            used = next(iter(_chosen.values()))
            raise ConfigError(f"--device {device}: this process already runs TensorFlow on {used}")
        _chosen[device] = _select(tf, device)
    return tf, _chosen[device]


def _select(tf: ModuleType, device: str) -> str:
    """Make ``device`` the only visible accelerator; returns its name."""
    if not re.fullmatch(DEVICE_PATTERN, device):
        raise ConfigError(f"--device {device!r}: {DEVICE_HELP}")
    gpus = tf.config.list_physical_devices("GPU")
    if device == "cpu" or (device == "auto" and not gpus):
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        return "cpu"
    index = int(device.partition(":")[2] or 0)
    if not gpus:
        raise ConfigError(f"--device {device}: TensorFlow sees no GPU on this machine")
    if index >= len(gpus):
        raise ConfigError(
            f"--device {device}: TensorFlow sees {len(gpus)} GPU(s), gpu:0..gpu:{len(gpus) - 1}"
        )
    tf.config.set_visible_devices([gpus[index]], "GPU")
    tf.config.experimental.set_memory_growth(gpus[index], True)  # several workers per GPU
    return f"gpu:{index}"
