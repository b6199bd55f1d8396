"""Your own Keras model as a Hop worker: a CNN with BatchNorm and Dropout, trained with Adam.

On the bundled digits (8x8 images), launched as 4 workers in backup mode:

    hopbus launch -n 4 --mode backup --iterations 300 -- python examples/keras_cnn.py

On CIFAR-10 (a folder holding the python batches data_batch_1..5 and test_batch):

    hopbus launch -n 4 --mode backup --iterations 2000 -- \\
        python examples/keras_cnn.py --cifar10 ~/cifar-10-batches-py

Run alone (python examples/keras_cnn.py --steps 300) it trains the same model on all the data
for that many steps, for comparison. The model is built without a seed: hopbus starts every
worker from worker 0's weights. Everything hopbus-specific is on the lines marked "hopbus".

Without a script at all, ``model`` and ``data`` below are what ``--model`` and ``--data`` take
(hopbus train, hopbus create, compose's MODEL and DATA):

    hopbus train -n 4 --mode backup --model examples/keras_cnn.py:model \
        --data examples/keras_cnn.py:data --iterations 300
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's start-up banners

import keras

import hopbus


def load(cifar10: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Images as (N, H, W, C) float32 in [0, 1] and integer labels: train, then test."""
    if cifar10:
        from hopbus.data.cifar10 import load_cifar10

        d = load_cifar10(cifar10)  # rows of 3072 numbers, channel-major
        image = lambda x: x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # noqa: E731
        return image(d.x_train), d.y_train, image(d.x_test), d.y_test
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))  # the same split on every worker
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


def build(
    input_shape: tuple[int, ...], classes: int, lr: float, decay_steps: int | None = None
) -> keras.Model:
    """No seed on purpose: each process draws its own weights. BatchNorm's moving statistics
    follow the batches with momentum 0.9 (Keras's 0.99 needs thousands of steps to settle).
    ``decay_steps``: Adam's rate falls to 5% along a cosine over that many steps."""
    width = 32 if input_shape[0] >= 32 else 16
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(width, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(momentum=0.9),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(2, padding="same"),
            keras.layers.Conv2D(2 * width, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(momentum=0.9),
            keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(classes),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(
            keras.optimizers.schedules.CosineDecay(lr, decay_steps, alpha=0.05)
            if decay_steps
            else lr
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def model(input_shape: tuple[int, ...], n_classes: int) -> keras.Model:
    """``--model keras_cnn:model``: the compiled network for hopbus train and compose."""
    return build(input_shape, n_classes, 0.003)


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``--data keras_cnn:data``: the digits as images, the same split as the script's."""
    return load(None)


class StopAfter(keras.callbacks.Callback):
    """Alone: stop fit after exactly ``steps`` batches."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps, self.done = steps, 0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.done += 1
        if self.done >= self.steps:
            self.model.stop_training = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar10", metavar="DIR", help="train on CIFAR-10 from this folder")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--steps", type=int, default=300, help="alone: batches to train on")
    parser.add_argument(
        "--save", metavar="FILE", help="save the final weights (.npz; launched: FILE-WORKER.npz)"
    )
    parser.add_argument(
        "--cosine", action="store_true", help="decay the rate to 5%% over the run (or --steps)"
    )
    args = parser.parse_args()

    x_train, y_train, x_test, y_test = load(args.cifar10)
    ctx = hopbus.join() if hopbus.launched() else None  # hopbus: one worker of the run
    # hopbus: a schedule over the run's iterations
    steps = (ctx.iterations if ctx else args.steps) if args.cosine else None
    model = build(x_train.shape[1:], int(y_train.max()) + 1, args.lr, steps)
    if ctx:
        x_train, y_train = ctx.shard(x_train, y_train)  # hopbus: its share of the data
        epochs = ctx.epochs(len(x_train), args.batch_size)  # hopbus: enough for the run
        callbacks = [hopbus.keras.HopCallback(ctx)]  # hopbus: Hop around every batch
    else:
        epochs = -(-args.steps * args.batch_size // len(x_train))
        callbacks = [StopAfter(args.steps)]
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=epochs,
        validation_data=(x_test, y_test),
        callbacks=callbacks,
        verbose=0,
    )
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print(f"test loss {loss:.4f}, accuracy {accuracy:.4f}")
    if args.save:  # launched: each copy under a name of its own (they share the folder)
        save = Path(args.save)
        if ctx:
            save = save.with_name(f"{save.stem}-{ctx.worker}{save.suffix}")
        np.savez(save, *model.get_weights())


if __name__ == "__main__":
    main()
