"""HopCallback's refusals that need no run: checked before it joins one (and by --model
before any worker starts)."""

import pytest
from helpers import needs

from hopbus.errors import RunFailure

pytestmark = needs("tensorflow", "the Keras tests need TensorFlow: pip install -e '.[tf]'")


@pytest.fixture(scope="module")
def keras():
    import keras

    return keras


@pytest.fixture(scope="module")
def hop_callback(keras):
    """hopbus.keras.HopCallback, imported once keras is."""
    from hopbus.keras import HopCallback

    return HopCallback


def test_an_optimizer_that_swaps_in_its_own_moving_average_is_refused(keras, hop_callback):
    """Adam(use_ema=True) puts each worker's own average of its weights into the model at the
    end of fit: the workers would end unlike each other and unlike the accuracy reported."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(use_ema=True), loss="mse")
    callback = hop_callback()
    callback.set_model(model)
    with pytest.raises(RunFailure, match="the optimizer has use_ema=True"):
        callback.on_train_begin()


def test_the_same_model_from_the_command_line_is_refused_before_any_worker_starts(keras):
    """--model MODULE:FUNCTION returning it: bad input, one line and status 2 before the run,
    as an uncompiled model is (it failed the run once a worker's fit began: status 1)."""
    from hopbus.errors import ConfigError
    from hopbus.models.custom import check_model

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(use_ema=True), loss="mse")
    with pytest.raises(ConfigError, match=r"--model 'm\.py:f': the optimizer has use_ema=True"):
        check_model(model, "m.py:f")


def test_train_steps_run_several_at_a_time_are_refused(keras, hop_callback):
    """steps_per_execution=4: Keras calls the callbacks once per 4 batches, so no exchange
    could come between them (it ran 4 optimizer steps per Hop iteration, and blamed the
    data for running out when fit ended early)."""
    from hopbus.errors import ConfigError
    from hopbus.models.custom import check_model

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
    callback = hop_callback()
    callback.set_model(model)
    with pytest.raises(RunFailure, match="compiled with steps_per_execution=4: Keras then runs"):
        callback.on_train_begin()
    with pytest.raises(ConfigError, match=r"--model 'm\.py:f': the model is compiled with steps_"):
        check_model(model, "m.py:f")


def test_weights_of_a_float_hopbus_does_not_carry_are_refused_not_left_out(keras):
    """A bfloat16 layer's weights are no numpy float: they were silently left out of the
    exchange (each worker kept its own), and a model of them only was 'nothing to train'."""
    from hopbus.keras import shared_weights

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, dtype="bfloat16")])
    with pytest.raises(RunFailure, match=r"weight '.*dense.*/kernel' is bfloat16, which hopbus"):
        shared_weights(model)
