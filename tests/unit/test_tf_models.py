"""The TensorFlow models: gradients against finite differences, the flat named params, the
seed, and the image shapes they accept."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import needs

from hopbus.errors import ConfigError
from hopbus.models import build_model
from hopbus.models.tf import TF_MODELS

pytestmark = needs("tensorflow", "the TensorFlow models need the tf extra")


def _batch(n_features: int, n: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, n_features), dtype=np.float32), rng.integers(0, 10, n)


def test_cnn_gradient_matches_central_differences() -> None:
    """float32 throughout, so along random directions: a derivative of size 3..15, far above
    float32's rounding (~1e-3 here at eps 1e-4). A larger eps crosses ReLU and max-pool kinks
    (eps 1e-2 is 10% off); measured agreement at 1e-4 is 1e-4 relative."""
    model = build_model("cnn", 64, 10)
    params = model.init_params(3)
    x, y = _batch(64)
    _, grads = model.loss_and_grad(params, x, y)
    rng = np.random.default_rng(1)
    eps = 1e-4
    for _ in range(4):
        d = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
        plus = {k: params[k] + eps * d[k] for k in params}
        minus = {k: params[k] - eps * d[k] for k in params}
        numeric = (model.loss_and_grad(plus, x, y)[0] - model.loss_and_grad(minus, x, y)[0]) / (
            2 * eps
        )
        analytic = sum(float(np.vdot(grads[k], d[k])) for k in params)
        assert numeric == pytest.approx(analytic, rel=1e-2)


@pytest.mark.parametrize(("name", "n_features"), [("cnn", 64), ("cnn", 3072), ("vgg11", 3072)])
def test_params_are_named_float32_arrays_and_grads_match(name: str, n_features: int) -> None:
    model = build_model(name, n_features, 10)
    params = model.init_params(0)
    n_conv = 2 if name == "cnn" else 8
    assert [k for k in params if k.startswith("conv")] == [
        f"conv{i}/{w}" for i in range(1, n_conv + 1) for w in ("kernel", "bias")
    ]
    assert all(v.dtype == np.float32 for v in params.values())
    x, y = _batch(n_features, n=2)
    loss, grads = model.loss_and_grad(params, x, y)
    assert np.isfinite(loss)
    assert list(grads) == list(params)
    assert all(grads[k].shape == v.shape and grads[k].dtype == v.dtype for k, v in params.items())
    test_loss, acc = model.evaluate(params, x, y)
    assert np.isfinite(test_loss) and 0 <= acc <= 1
    assert model.device in ("cpu", "gpu:0")  # auto: a GPU where TensorFlow sees one


def test_same_seed_same_params() -> None:
    a, b = build_model("cnn", 64, 10), build_model("cnn", 64, 10)
    pa, pb, pc = a.init_params(7), b.init_params(7), a.init_params(8)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert not np.array_equal(pa["conv1/kernel"], pc["conv1/kernel"])


def test_cnn_learns_digits() -> None:
    """Plain SGD in one process, a few seconds: the loss must go down on real data."""
    from hopbus.data import Batches, load_dataset
    from hopbus.models import SGD

    data = load_dataset("digits")
    model = build_model("cnn", data.n_features, data.n_classes)
    params = model.init_params(0)
    opt = SGD(0.05)
    batches = Batches(data.x_train, data.y_train, 32, seed=0)
    for _ in range(300):
        params = opt.step(params, model.loss_and_grad(params, *batches.next())[1])
    _, acc = model.evaluate(params, data.x_test, data.y_test)
    assert acc >= 0.90  # measured 0.96..0.98 over seeds 0..2


@pytest.mark.parametrize("name", TF_MODELS)
@pytest.mark.parametrize("n_features", [5, 100, 3071])
def test_non_image_data_is_refused_in_one_line(name: str, n_features: int) -> None:
    with pytest.raises(ConfigError) as err:
        build_model(name, n_features, 10)
    text = str(err.value)
    assert f"model {name!r}" in text and f"{n_features} features" in text and "\n" not in text


def test_gpu_without_a_gpu_is_one_line() -> None:
    import tensorflow as tf

    from hopbus.models.tf.runtime import _select

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees a GPU here")
    for device in ("gpu", "gpu:1"):
        with pytest.raises(ConfigError, match=f"--device {device}: TensorFlow sees no GPU"):
            _select(tf, device)
