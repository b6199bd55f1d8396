"""A PyTorch training loop as a Hop worker: an MLP with BatchNorm on the bundled digits, Adam.

Launched, every copy trains on its own shard and averages with its neighbours:

    hopbus launch -n 4 --mode backup --iterations 300 -- python examples/torch_loop.py

Run alone (python examples/torch_loop.py) it trains on all the data, for comparison.

hopbus sees numpy arrays: the model's floating-point state (its parameters and BatchNorm's
running statistics) as numpy views of the tensors' own memory, so handing them to hopbus and
taking its result back are plain copies, with no change to the model, the optimizer or the
loss. Adam's moments stay on each worker, as they would in any framework.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional

import hopbus


def state_of(model: nn.Module) -> dict[str, np.ndarray]:
    """The model's floating-point state as numpy arrays that share the tensors' memory
    (integer state such as BatchNorm's batch counter stays local)."""
    return {k: v.numpy() for k, v in model.state_dict().items() if v.is_floating_point()}


def load(state: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> None:
    """Copy the parameters hopbus hands out into the model (they are read-only: never train
    in them)."""
    for name, array in params.items():
        np.copyto(state[name], array)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = functional.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(dim=1) == y).float().mean().item()
    model.train()
    return loss, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300, help="alone: steps to take")
    args = parser.parse_args()

    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[:360], order[360:]
    x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]

    # no seed: hopbus gives every worker worker 0's start
    model = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    state = state_of(model)

    def step(xs: torch.Tensor, ys: torch.Tensor) -> float:
        rows = torch.randint(0, len(ys), (args.batch_size,))
        optimizer.zero_grad()
        loss = functional.cross_entropy(model(xs[rows]), ys[rows])
        loss.backward()
        optimizer.step()
        return loss.item()

    if not hopbus.launched():  # alone, on all the data
        for _ in range(args.steps):
            step(x_train, y_train)
        test_loss, test_acc = evaluate(model, x_test, y_test)
        print(f"alone: test loss {test_loss:.4f}, accuracy {test_acc:.4f}")
        return

    with hopbus.join() as ctx:
        xs, ys = ctx.shard(x_train, y_train)
        load(state, ctx.start(state))  # worker 0's: every worker starts alike
        while not ctx.done:
            load(state, ctx.begin())  # x_k (a jump's, after skipping): on its way already
            loss = step(xs, ys)  # PyTorch's own step, in the model's memory
            load(state, ctx.end(state, loss=loss))  # x_k+1 = Reduce(x_k, neighbours) + step
            if ctx.iteration % 50 == 0:
                test_loss, test_acc = evaluate(model, x_test, y_test)
                ctx.log(eval_loss=test_loss, eval_accuracy=test_acc)
        test_loss, test_acc = evaluate(model, x_test, y_test)
        ctx.finish(loss=test_loss, accuracy=test_acc)
        print(f"worker {ctx.worker}: test accuracy {test_acc:.4f}")


if __name__ == "__main__":
    main()
