"""--model and --data MODULE:FUNCTION: a user's function found, called and checked, and every
way it can be wrong said in one line."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from hopbus.data import DataError, load_dataset
from hopbus.errors import ConfigError
from hopbus.models import build_model
from hopbus.models.custom import check_model, is_callable_spec, load_callable


def module(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_specs_are_told_apart_from_built_in_names():
    assert is_callable_spec("models:build") and is_callable_spec("pkg.nets:vgg")
    assert is_callable_spec("code/models.py:build")
    assert not is_callable_spec("softmax") and not is_callable_spec("models:")
    assert not is_callable_spec("models:build(1)")


def test_a_file_path_and_a_module_name_both_load(tmp_path, monkeypatch):
    path = module(tmp_path, "um_load", "def f():\n    return 41 + 1\n")
    assert load_callable(f"{path}:f", "--model")() == 42
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_callable("um_load:f", "--model")() == 42


@pytest.mark.parametrize(
    ("body", "spec_tail", "expected"),
    [
        ("x = 1\n", ":nothing", "has no 'nothing'"),
        ("x = 1\n", ":x", "'x' is an int, not a function"),
        (
            "raise ValueError('bad config line\\nsecond line')\n",
            ":f",
            "importing .* failed: ValueError: bad config line$",
        ),
        ("import no_such_module_hopbus\n", ":f", "no module named 'no_such_module_hopbus'"),
        # a script's argparse at module level: it sees no flags (hopbus's were taken for its
        # own: "hopbus: error: unrecognized arguments"), and a required one ends it, said so
        (
            "import argparse, sys\nassert sys.argv[1:] == []\np = argparse.ArgumentParser()\n"
            "p.add_argument('--steps', type=int, default=3)\nSTEPS = p.parse_args().steps\n"
            "def f():\n    return STEPS\n",
            ":nothing",
            "has no 'nothing'",
        ),
        (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('data')\n"
            "p.parse_args()\n",
            ":f",
            "ended the program \\(sys.exit\\(2\\)\\): keep what a script does when run, "
            'command-line parsing included, under `if __name__ == "__main__":`',
        ),
    ],
)
def test_what_cannot_be_loaded_is_one_line(tmp_path, body, spec_tail, expected):
    path = module(tmp_path, f"um_bad_{abs(hash(body)) % 10**6}", body)
    with pytest.raises(ConfigError, match=expected) as info:
        load_callable(f"{path}{spec_tail}", "--model")
    assert "\n" not in str(info.value)


def test_missing_file_and_module(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no such file"):
        load_callable(f"{tmp_path}/absent.py:f", "--data")
    with pytest.raises(ConfigError, match="no module named 'hopbus_absent_mod'"):
        load_callable("hopbus_absent_mod:f", "--data")
    # where it looked, PYTHONPATH included: in compose, CODE_DIR's mount (a container-user
    # was told to run from the right folder)
    monkeypatch.setenv("PYTHONPATH", "/home/hopbus/code")
    with pytest.raises(ConfigError, match=r"and PYTHONPATH /home/hopbus/code: .*CODE_DIR"):
        load_callable("hopbus_absent_mod:f", "--data")


def test_a_module_whose_import_is_not_installed_says_so(tmp_path):
    """Fault ``missing_dependency``: the user's file is there, a package it imports is not:
    said as such, not as a folder to run from."""
    path = module(tmp_path, "um_needs_keras", "import keras_absent_for_hopbus as keras\n")
    with pytest.raises(ConfigError) as info:
        load_callable(f"{path}:model", "--model")
    said = str(info.value)
    assert "no module named 'keras_absent_for_hopbus', which it imports: not installed" in said
    assert "PYTHONPATH" not in said
    path = module(tmp_path, "um_needs_part", "import numpy.no_such_part_for_hopbus\n")
    with pytest.raises(ConfigError, match="numpy is installed, with no such part: is the name"):
        load_callable(f"{path}:model", "--model")


def test_a_model_function_gets_what_it_names_and_must_return_a_model(tmp_path):
    path = module(
        tmp_path,
        "um_models",
        """
        import numpy as np

        class Lin:
            def __init__(self, n_features, n_classes):
                self.shape = (n_features, n_classes)
            def init_params(self, seed):
                return {"W": np.zeros(self.shape, np.float32)}
            def loss_and_grad(self, params, x, y):
                return 0.0, {"W": np.zeros_like(params["W"])}
            def evaluate(self, params, x, y):
                return 0.0, 1.0

        def good(n_classes, n_features):
            return Lin(n_features, n_classes)

        def wrong():
            return {"W": 1}

        def raises(**kw):
            raise RuntimeError("no GPU here")
        """,
    )
    got = build_model(f"{path}:good", 64, 10)
    assert got.shape == (64, 10)
    with pytest.raises(ConfigError, match="returned a dict: expected a compiled Keras model"):
        build_model(f"{path}:wrong", 64, 10)
    with pytest.raises(ConfigError, match="raised RuntimeError: no GPU here"):
        build_model(f"{path}:raises", 64, 10)
    with pytest.raises(ConfigError, match="returned an int"):
        check_model(3, "m:f")


def test_user_data_is_checked(tmp_path):
    path = module(
        tmp_path,
        "um_data",
        """
        import numpy as np
        rng = np.random.default_rng(0)
        x = rng.random((20, 4, 4, 1))
        y = np.arange(20) % 3

        def good():
            return x, y, x[:5], y[:5]

        def floats():
            return x, y.astype(float), x[:5], y[:5].astype(float)

        def three():
            return x, y, x

        def short():
            return x, y[:10], x, y

        def nan():
            bad = x.copy(); bad[7, 0, 0, 0] = np.nan
            return bad, y, x[:5], y[:5]

        def scalar_y():
            return x, 3, x[:5], y[:5]

        def float64_only():
            bad = x.copy(); bad[3, 1, 0, 0] = 1e39  # finite in float64, inf in float32
            return bad, y, x[:5], y[:5]

        def negative():
            return x, y - 1, x[:5], y[:5]

        def huge():
            return x, y * 10**12, x[:5], y[:5]

        def shapes():
            return x, y, x[:, :2], y

        def strings():
            return x, np.array(["a"] * 20), x, y

        def column():
            return x, y[:, None], x[:5], y[:5, None]

        def one_hot():
            return x, np.eye(3, dtype=np.int64)[y], x[:5], y[:5]
        """,
    )
    d = load_dataset(f"{path}:good")
    assert d.x_train.shape == (20, 4, 4, 1) and d.x_train.dtype == np.float32
    assert d.y_train.dtype == np.int64 and d.n_classes == 3 and d.n_features == 16
    # fault ``label_column``: integer labels shaped [N, 1] broadcast into an accuracy of 39
    c = load_dataset(f"{path}:column")
    assert c.y_train.shape == (20,) and c.y_test.shape == (5,) and c.n_classes == 3
    f = load_dataset(f"{path}:floats")
    assert f.y_train.dtype == np.float32 and f.n_classes == 0
    with pytest.raises(ConfigError, match="'softmax' classifies, but the data's labels are floats"):
        build_model("softmax", n_features=f.n_features, n_classes=f.n_classes)
    for name, expected in [
        ("three", "expected 4 arrays, \\(x_train, y_train, x_test, y_test\\)"),
        ("short", "x_train has 20 rows and y_train 10"),
        ("nan", "x_train row 7 holds a value that is not finite"),
        ("float64_only", "x_train row 3 holds a value beyond float32's range"),
        ("scalar_y", "y_train is a single number, not one row per sample"),
        ("negative", "integer labels must be 0..C-1, found -1"),
        ("huge", "integer labels must be 0..C-1 with C at most 100000, found 2000000000000 "),
        ("shapes", "x_train rows are \\[4, 4, 1\\], x_test rows \\[2, 4, 1\\]"),
        ("strings", "y_train holds <U1, not numbers"),
        # fault ``one_hot_ints``: they reached softmax's loss as indices and failed mid-run
        ("one_hot", "y_train has shape \\[20, 3\\]: integer labels are class ids, one per row"),
    ]:
        with pytest.raises(DataError, match=expected):
            load_dataset(f"{path}:{name}")


def test_built_in_data_names_are_not_modules():
    with pytest.raises(DataError, match="unknown data set"):
        load_dataset("digits:load")


def test_a_user_function_that_runs_long_is_said_on_stderr_until_it_returns(capsys, monkeypatch):
    """A --data function that downloads, or hangs, is not a silent terminal: past
    TELL_AFTER_S a line says what is running, for how long, and that Ctrl-C stops it; none
    comes once it has returned."""
    from hopbus.models import custom

    monkeypatch.setattr(custom, "TELL_AFTER_S", 0.05)
    said: list[str] = []

    def slow():  # returns once hopbus has said that it is still running (10 s at most)
        for _ in range(1000):
            said.append(capsys.readouterr().err)
            if "still running" in said[-1]:
                return 7
            threading.Event().wait(0.01)
        return None

    assert custom.call_user(slow, "mine:slow", "--data") == 7
    line = next(s for s in said if "still running" in s).strip()
    assert line.startswith("hopbus: --data 'mine:slow' still running after 0 s (Ctrl-C stops it)")
    assert custom.call_user(lambda: 8, "mine:fast", "--data") == 8
    assert "still running" not in capsys.readouterr().err


class _Numpy:
    """A numpy model of the user's: softmax regression, 3 features, 2 classes."""

    name = "mine"

    def init_params(self, seed):
        return {"w": np.zeros((3, 2), np.float32), "b": np.zeros(2, np.float32)}

    def loss_and_grad(self, p, x, y):
        return 0.7, {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)}

    def evaluate(self, p, x, y):
        return 0.7, 0.5


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"init_params": lambda s, seed: {}}, "init_params(seed) returned an empty dict"),
        ({"init_params": lambda s, seed: {"w": [1.0]}}, "returned a list for 'w'"),
        ({"loss_and_grad": lambda s, p, x, y: [0.7, [1]]}, "returned gradients a list"),
        ({"loss_and_grad": lambda s, p, x, y: 0.7}, "returned a float: expected (loss, gradients)"),
        ({"loss_and_grad": lambda s, p, x, y: ("x", {})}, "a loss that is not a finite number"),
        ({"loss_and_grad": lambda s, p, x, y: (1.0, {"w": np.ones(3), "b": np.ones(2)})},
         "a gradient of 'w' shaped (3,), its parameter (3, 2)"),
        ({"evaluate": lambda s, p, x, y: None}, "evaluate(params, x, y) returned None"),
        ({"evaluate": lambda s, p, x, y: ("low", "high")}, "returned a str as its loss"),
        ({"evaluate": lambda s, p, x, y: (0.7, 7.5)},
         "evaluate(params, x, y): accuracy 7.5 is not a fraction in [0, 1] (a percentage?"),
        ({"loss_and_grad": lambda s, p, x, y: (0.7, {"w": np.ones((3, 2), np.int64),
                                                      "b": np.ones(2, np.float32)})},
         "returned an int64 numpy array as the gradient of 'w': expected float ones"),
        ({"loss_and_grad": lambda s, p, x, y: (np.array([0.7]), {})},
         "a loss that is not a finite number (a float64 numpy array)"),
        ({"evaluate": lambda s, p, x, y: 1 / 0}, "its evaluate() raised ZeroDivisionError"),
    ],
)  # fmt: skip
def test_a_numpy_model_that_returns_the_wrong_thing_is_one_line_before_the_run(change, said):
    """Fault ``odd_numpy_model``: --model FILE.py:F returning a numpy model whose methods
    return the wrong things failed in the workers, with a traceback through hopbus's own
    files (optim.py) and exit status 1; it is now refused before any process starts."""
    from hopbus.models.custom import check_numpy_model

    model = type("Odd", (_Numpy,), change)()
    x, y = np.zeros((4, 3), np.float32), np.zeros(4, np.int64)
    with pytest.raises(ConfigError) as caught:
        check_numpy_model(model, "m.py:f", 0, x, y)
    assert said in str(caught.value) and str(caught.value).startswith("--model 'm.py:f': ")
    check_numpy_model(_Numpy(), "m.py:f", 0, x, y)  # the same, as it should be: no refusal
    # what the workers take is taken here too: an array of two, an accuracy not measured
    for answer in (np.array([0.7, 0.5]), (0.7, float("nan")), (None, None)):
        odd = type("Pair", (_Numpy,), {"evaluate": lambda s, p, x, y, a=answer: a})()
        check_numpy_model(odd, "m.py:f", 0, x, y)


def test_what_a_numpy_models_methods_print_goes_to_stderr(capsys):
    """Fault ``printing_model``: a model whose methods print wrote into hopbus train's stdout,
    which under --json must hold one JSON object."""
    from hopbus.models.custom import check_numpy_model

    class Loud(_Numpy):
        def evaluate(self, p, x, y):
            print("evaluating")
            return 0.7, 0.5

    check_numpy_model(Loud(), "m.py:f", 0, np.zeros((4, 3), np.float32), np.zeros(4, np.int64))
    out, err = capsys.readouterr()
    assert out == "" and "evaluating" in err


def test_a_file_named_like_a_library_module_leaves_that_module_alone(tmp_path, capsys):
    """A user's json.py took sys.modules['json']'s place (hopbus's own json.dumps then failed),
    and what a module printed while imported went to stdout, the command's (--json)."""
    import json

    path = module(tmp_path, "json", "print('HELLO FROM IMPORT')\ndef f():\n    return 7\n")
    assert load_callable(f"{path}:f", "--data")() == 7
    assert load_callable(f"{path}:f", "--model")() == 7  # the same file again: imported once
    assert sys.modules["json"] is json and json.dumps([1]) == "[1]"
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.count("HELLO FROM IMPORT") == 1
