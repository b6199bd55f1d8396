"""HopCallback's refusals that need no run: checked before it joins one."""

import pytest

pytest.importorskip("tensorflow", reason="the Keras tests need TensorFlow: pip install -e '.[tf]'")

import keras

from hopbus.errors import RunFailure
from hopbus.keras import HopCallback


def test_an_optimizer_that_swaps_in_its_own_moving_average_is_refused():
    """Adam(use_ema=True) puts each worker's own average of its weights into the model at the
    end of fit: the workers would end unlike each other and unlike the accuracy reported."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(use_ema=True), loss="mse")
    callback = HopCallback()
    callback.set_model(model)
    with pytest.raises(RunFailure, match="the optimizer has use_ema=True"):
        callback.on_train_begin()
