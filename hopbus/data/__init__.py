"""Training data: loading the sets the paper (or a laptop) trains on, and cutting them into each
worker's shard and minibatches.

Every loader returns a :class:`Dataset` of dense float32 features and int64 labels 0..C-1, and
turns anything wrong with the user's files or spec into a one-line :class:`DataError`.
"""

from hopbus.data.batches import Batches, shard, shard_rows
from hopbus.data.dataset import DataError, Dataset
from hopbus.data.spec import DATA_GRAMMAR, load_dataset

__all__ = ["DATA_GRAMMAR", "Batches", "DataError", "Dataset", "load_dataset", "shard", "shard_rows"]
