"""The ``--data`` grammar: one string names a data set and how to build it."""

from __future__ import annotations

from pathlib import Path

from hopbus.data.dataset import DataError, Dataset, Keep

DATA_GRAMMAR = (
    "digits | synthetic[:SAMPLES[,FEATURES[,CLASSES]]] | svmlight:PATH[,TEST_PATH] | cifar10:DIR "
    "| MODULE:FUNCTION (your own arrays)"
)
BUILT_IN = ("digits", "synthetic", "svmlight", "cifar10")
"""The data sets hopbus loads itself; any other MODULE:FUNCTION is a user's function."""


def _svmlight_paths(args: str) -> tuple[str, str | None]:
    """PATH or PATH,TEST_PATH; a path that itself exists wins over splitting at its comma."""
    if not args.strip():
        raise DataError(f"svmlight needs a file: {DATA_GRAMMAR}")
    if "," not in args or Path(args).exists():
        return args, None
    path, _, test_path = args.partition(",")
    if not path.strip() or not test_path.strip():
        raise DataError(f"svmlight:PATH[,TEST_PATH] has an empty path in {args!r}")
    return path, test_path


def is_user_data(spec: str) -> bool:
    """Whether ``spec`` names a user's function, which ``load_dataset`` imports (a built-in
    kind with a file or folder, ``svmlight:a9a``, never does)."""
    from hopbus.models.custom import is_callable_spec

    text = spec.strip()
    kind = text.partition(":")[0].strip().lower()
    return kind not in BUILT_IN and is_callable_spec(text)


def files_of(spec: str) -> list[Path]:
    """The files of this machine that ``spec`` reads, by the grammar ``load_dataset`` follows:
    svmlight's, or a user's FILE.py (a folder, CIFAR-10's, is no file a command writes)."""
    text = spec.strip()
    kind, sep, args = text.partition(":")
    if kind.strip().lower() == "svmlight" and sep:
        try:
            return [Path(p) for p in _svmlight_paths(args) if p is not None]
        except DataError:
            return []
    if is_user_data(text):
        from hopbus.models.custom import user_file

        return [f] if (f := user_file(text)) is not None else []
    return []


def load_dataset(spec: str, seed: int = 0, keep: Keep = None) -> Dataset:
    """The data set ``spec`` names (``seed`` only shapes generated data, never a test split).
    ``keep`` (worker, workers, seed): the files that allow it (svmlight, CIFAR-10) are made
    dense for that worker's share of the training rows only (``Dataset.shard`` says so)."""
    text = spec.strip()
    kind, sep, args = text.partition(":")
    kind = kind.strip().lower()
    if kind == "digits" and not sep:
        from hopbus.data.digits import load_digits

        return load_digits()
    if kind == "synthetic":
        from hopbus.data.synthetic import make_synthetic, parse_synthetic

        return make_synthetic(*parse_synthetic(args), seed=seed)
    if kind == "svmlight" and sep:
        from hopbus.data.svmlight import load_svmlight

        return load_svmlight(*_svmlight_paths(args), keep=keep)
    if kind == "cifar10":
        from hopbus.data.cifar10 import load_cifar10

        if not args.strip():
            raise DataError(
                "cifar10 needs the folder of its batches: --data cifar10:DIR, or --data cifar10 "
                "--data-dir DIR"
            )
        return load_cifar10(args, keep=keep)
    if is_user_data(text):
        from hopbus.data.user import load_user_data

        return load_user_data(text)
    raise DataError(f"unknown data set {spec!r}; expected {DATA_GRAMMAR}")
