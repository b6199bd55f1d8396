"""A plain numpy training loop as a Hop worker: softmax regression on the bundled digits.

Launched, every copy trains on its own shard and averages with its neighbours:

    hopbus launch -n 4 --mode backup --iterations 300 -- python examples/numpy_loop.py

Run alone (python examples/numpy_loop.py) it trains on all the data, for comparison.
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits

import hopbus


def loss_and_grad(params: dict, x: np.ndarray, y: np.ndarray) -> tuple[float, dict]:
    """Mean cross-entropy of softmax(x W + b) and its gradient."""
    logits = x @ params["W"] + params["b"]
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return loss, {"W": x.T @ p, "b": p.sum(axis=0)}


def evaluate(params: dict, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    logits = x @ params["W"] + params["b"]
    loss, _ = loss_and_grad(params, x, y)
    return loss, float((logits.argmax(axis=1) == y).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300, help="alone: steps to take")
    args = parser.parse_args()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[:360], order[360:]
    x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    rng = np.random.default_rng()  # no seed: hopbus gives every worker worker 0's start
    params = {
        "W": rng.normal(0.0, 0.01, (64, 10)).astype(np.float32),
        "b": np.zeros(10, np.float32),
    }

    def step(params: dict, xs: np.ndarray, ys: np.ndarray) -> tuple[dict, float]:
        rows = rng.integers(0, len(ys), args.batch_size)
        loss, grads = loss_and_grad(params, xs[rows], ys[rows])
        return {k: params[k] - args.lr * grads[k] for k in params}, loss

    if not hopbus.launched():  # alone, on all the data
        for _ in range(args.steps):
            params, _ = step(params, x_train, y_train)
        test_loss, test_acc = evaluate(params, x_test, y_test)
        print(f"alone: test loss {test_loss:.4f}, accuracy {test_acc:.4f}")
        return

    with hopbus.join() as ctx:
        xs, ys = ctx.shard(x_train, y_train)
        params = ctx.start(params)  # worker 0's: every worker starts alike
        evaluated = 0  # the iteration of the last evaluation
        while not ctx.done:
            params = ctx.begin()  # x_k: it is on its way to the neighbours already
            new, loss = step(params, xs, ys)
            params = ctx.end(new, loss=loss)  # x_k+1 = Reduce(x_k, neighbours) + your step
            if ctx.iteration // 50 > evaluated // 50:  # a jump (--skip-max) may pass over 50
                test_loss, test_acc = evaluate(params, x_test, y_test)
                ctx.log(eval_loss=test_loss, eval_accuracy=test_acc)
                evaluated = ctx.iteration
        test_loss, test_acc = evaluate(params, x_test, y_test)
        ctx.finish(loss=test_loss, accuracy=test_acc)
        print(f"worker {ctx.worker}: test accuracy {test_acc:.4f}")


if __name__ == "__main__":
    main()
