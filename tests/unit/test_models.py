"""hopbus.models: gradients against finite differences, SGD by hand, and real training runs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import hopbus.models.base as models_base
from hopbus.data import Batches, load_dataset
from hopbus.errors import ConfigError, UserError
from hopbus.models import MODELS, SGD, Model, Params, build_model

N_FEATURES = 5
N_CLASSES = {"logreg": 2, "softmax": 3, "mlp": 3}


def random_problem(name: str, seed: int = 0) -> tuple[Model, Params, np.ndarray, np.ndarray]:
    """A model with random float64 params (away from the zero start) and a small batch."""
    rng = np.random.default_rng(seed)
    model = build_model(name, N_FEATURES, N_CLASSES[name], hidden=7)
    params = {k: rng.normal(0, 0.5, v.shape) for k, v in model.init_params(seed).items()}
    x = rng.normal(size=(11, N_FEATURES))
    y = rng.integers(0, N_CLASSES[name], 11)
    return model, params, x, y


@pytest.mark.parametrize("name", MODELS)
def test_gradient_matches_central_differences(name: str) -> None:
    model, params, x, y = random_problem(name)
    _, grads = model.loss_and_grad(params, x, y)
    eps = 1e-6
    for key, p in params.items():
        assert grads[key].shape == p.shape and grads[key].dtype == np.float64
        numeric = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            for sign in (1, -1):
                shifted = p.copy()
                shifted[i] += sign * eps
                loss, _ = model.loss_and_grad({**params, key: shifted}, x, y)
                numeric[i] += sign * loss / (2 * eps)
        np.testing.assert_allclose(grads[key], numeric, rtol=1e-5, atol=1e-8, err_msg=key)


@pytest.mark.parametrize("name", MODELS)
def test_float32_path_returns_float32_close_to_float64(name: str) -> None:
    model, params64, x, y = random_problem(name, seed=3)
    params32 = {k: v.astype(np.float32) for k, v in params64.items()}
    loss32, grads32 = model.loss_and_grad(params32, x.astype(np.float32), y)
    loss64, grads64 = model.loss_and_grad(params64, x, y)
    assert isinstance(loss32, float)
    assert loss32 == pytest.approx(loss64, rel=1e-4)
    for key, g in grads32.items():
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, grads64[key], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_huge_logits_stay_finite(name: str) -> None:
    model, params, x, y = random_problem(name, seed=4)
    params = {k: (v * 1e4).astype(np.float32) for k, v in params.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow in exp would warn
        loss, grads = model.loss_and_grad(params, x.astype(np.float32), y)
        eval_loss, _ = model.evaluate(params, x.astype(np.float32), y)
    assert np.isfinite(loss) and np.isfinite(eval_loss)
    assert all(np.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("name", MODELS)
def test_evaluate_in_chunks_matches_one_pass(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, params, x, y = random_problem(name, seed=5)
    loss, acc = model.evaluate(params, x, y)
    monkeypatch.setattr(models_base, "EVAL_CHUNK", 3)
    chunked_loss, chunked_acc = model.evaluate(params, x, y)
    assert chunked_loss == pytest.approx(loss) and chunked_acc == acc
    assert loss == pytest.approx(model.loss_and_grad(params, x, y)[0])
    assert 0.0 <= acc <= 1.0


def test_evaluate_counts_correct_predictions() -> None:
    model = build_model("logreg", 1, 2)
    params = {"w": np.array([1.0], np.float32), "b": np.array([0.0], np.float32)}
    x = np.array([[2.0], [-1.0], [3.0], [-4.0]], np.float32)
    y = np.array([1, 0, 0, 0])
    assert model.evaluate(params, x, y)[1] == 0.75


@pytest.mark.parametrize("name", MODELS)
def test_init_params_deterministic_named_float32(name: str) -> None:
    model = build_model(name, 4, 2, hidden=6)
    a, b = model.init_params(7), model.init_params(7)
    assert list(a) == list(b) and isinstance(model, Model) and model.name == name
    for key in a:
        assert a[key].dtype == np.float32
        np.testing.assert_array_equal(a[key], b[key])
    shapes = {k: v.shape for k, v in a.items()}
    expected = {
        "logreg": {"w": (4,), "b": (1,)},
        "softmax": {"W": (4, 2), "b": (2,)},
        "mlp": {"W1": (4, 6), "b1": (6,), "W2": (6, 2), "b2": (2,)},
    }[name]
    assert shapes == expected


def test_mlp_init_depends_on_seed_with_he_scale() -> None:
    model = build_model("mlp", 400, 10, hidden=300)
    a, b = model.init_params(1), model.init_params(2)
    assert not np.array_equal(a["W1"], b["W1"])
    assert a["W1"].std() == pytest.approx(np.sqrt(2 / 400), rel=0.05)
    assert a["W2"].std() == pytest.approx(np.sqrt(2 / 300), rel=0.1)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("logreg", 4, 10), "softmax"),
        (("resnet", 4, 10), "logreg, softmax, mlp"),
        (("softmax", 0, 10), "feature"),
        (("softmax", 4, 1), "2 classes"),
    ],
)
def test_build_model_refuses_in_one_line(args: tuple[str, int, int], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_model(*args)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, UserError)


def test_sgd_two_steps_by_hand() -> None:
    opt = SGD(lr=0.1, momentum=0.9, weight_decay=0.01)
    p0 = {"w": np.array([1.0, 2.0], np.float32)}
    p1 = opt.step(p0, {"w": np.array([0.5, -1.0], np.float32)})
    # g = [0.51, -0.98] = v;  p = p0 - 0.1 v
    np.testing.assert_allclose(p1["w"], [0.949, 2.098], rtol=1e-6)
    p2 = opt.step(p1, {"w": np.array([0.2, 0.3], np.float32)})
    # g = [0.20949, 0.32098];  v = 0.9 [0.51, -0.98] + g = [0.66849, -0.56102]
    np.testing.assert_allclose(p2["w"], [0.882151, 2.154102], rtol=1e-6)
    assert p2["w"].dtype == np.float32


def test_sgd_never_modifies_its_inputs() -> None:
    opt = SGD(lr=0.5, momentum=0.9, weight_decay=0.1)
    params = {"W": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    grads = {"W": np.full((2, 3), 0.5, np.float32), "b": np.ones(3, np.float32)}
    for arr in (*params.values(), *grads.values()):
        arr.flags.writeable = False  # any in-place write would raise
    before = {k: v.copy() for k, v in params.items()}
    new = opt.step(params, grads)
    new = opt.step(new, grads)
    for key, old in params.items():
        np.testing.assert_array_equal(old, before[key])
        assert new[key] is not old
        assert not np.shares_memory(new[key], old)
        assert not np.shares_memory(new[key], grads[key])
    assert list(new) == ["W", "b"]


def test_sgd_state_round_trip() -> None:
    params = {"w": np.array([1.0, -1.0], np.float32)}
    grads = {"w": np.array([0.3, 0.7], np.float32)}
    first = SGD(0.1, 0.9)
    stepped = first.step(params, grads)
    state = first.state()
    second = SGD(0.1, 0.9)
    second.load_state(state)
    state["w"][:] = 99  # the optimizer keeps its own copy
    np.testing.assert_array_equal(first.step(stepped, grads)["w"], second.step(stepped, grads)["w"])


@pytest.mark.parametrize(
    "kwargs", [{"lr": 0.0}, {"lr": 0.1, "momentum": 1.0}, {"lr": 0.1, "weight_decay": -1.0}]
)
def test_sgd_refuses_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        SGD(**kwargs)


def train(spec: str, name: str, steps: int, lr: float) -> float:
    """Centralized minibatch SGD (batch 32, momentum 0.9); the test accuracy reached."""
    ds = load_dataset(spec, seed=1)
    model = build_model(name, ds.n_features, ds.n_classes)
    params = model.init_params(0)
    opt = SGD(lr, momentum=0.9, weight_decay=1e-4)
    batches = Batches(ds.x_train, ds.y_train, 32, seed=0)
    for _ in range(steps):
        _, grads = model.loss_and_grad(params, *batches.next())
        params = opt.step(params, grads)
    return model.evaluate(params, ds.x_test, ds.y_test)[1]


@pytest.mark.parametrize(
    ("spec", "name", "lr"),
    [("digits", "softmax", 0.1), ("synthetic", "logreg", 0.1), ("digits", "mlp", 0.05)],
)
def test_training_reaches_ninety_percent(spec: str, name: str, lr: float) -> None:
    assert train(spec, name, steps=300, lr=lr) >= 0.9
