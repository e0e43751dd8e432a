"""Datasets for the course: Fashion-MNIST when it is available, scikit-learn's digits otherwise.

Introduced in 01-device and used by every notebook after it. `load()` never switches silently: it prints
which dataset it returns and why, and keeps the reason in `DataBundle.reason`. Splits are deterministic
(same seed, same split). torchvision and scikit-learn are imported only when a dataset is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.util
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from .env import on_colab

__all__ = ["DataBundle", "DatasetCacheError", "load", "digits", "fashion_mnist", "synthetic", "split", "default_root"]

# torchvision's FashionMNIST reads these four files from <root>/FashionMNIST/raw/ (and downloads their .gz).
FASHION_FILES = (
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
)
_CHOICES = ("auto", "fashion_mnist", "digits")


class DatasetCacheError(RuntimeError):
    """A dataset folder on disk is corrupt or incomplete; the message names it and how to clear it.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = Path(path)
        super().__init__(
            f"The dataset cache in {self.path} is corrupt or incomplete: {problem}. Delete that folder and load "
            f"again (it is downloaded again where downloading is allowed): in Python, "
            f"import shutil; shutil.rmtree({str(self.path)!r}), or in a shell, rm -rf '{self.path}'."
        )


@dataclasses.dataclass(frozen=True)
class DataBundle:
    """A dataset ready for training: float32 images N×C×H×W in [0, 1] and int64 labels, split in two.
    """

    train: TensorDataset
    val: TensorDataset
    name: str
    reason: str
    num_classes: int
    input_shape: tuple[int, ...]
    classes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: which dataset, how big, and why this one."""
        shape = "×".join(map(str, self.input_shape))
        return (
            f"Dataset: {self.name}, {len(self.train)} training and {len(self.val)} validation images "
            f"of shape {shape}, {self.num_classes} classes. Why: {self.reason}"
        )


def default_root() -> Path:
    """Where datasets live: $COURSE_DATA, /content/data on Colab, <repo>/data in a checkout, else ~/.cache.
    """
    if os.environ.get("COURSE_DATA"):
        return Path(os.environ["COURSE_DATA"]).expanduser()
    if on_colab():
        return Path("/content/data")
    repo = Path(__file__).resolve().parent.parent
    if (repo / "pyproject.toml").is_file():
        return repo / "data"
    return Path.home() / ".cache" / "gpu-course" / "data"


def _split_indices(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = int(round(n * val_fraction))
    return order[n_val:], order[:n_val]


def split(dataset: Dataset, val_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Split into (train, val) in a random order fixed by `seed`: same seed, same split.

    A TensorDataset gives TensorDatasets, any other dataset gives Subsets.
    """
    train_idx, val_idx = _split_indices(len(dataset), val_fraction, seed)  # type: ignore[arg-type]
    if isinstance(dataset, TensorDataset):
        return (
            TensorDataset(*(t[train_idx] for t in dataset.tensors)),
            TensorDataset(*(t[val_idx] for t in dataset.tensors)),
        )
    return Subset(dataset, train_idx.tolist()), Subset(dataset, val_idx.tolist())


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")


def _bundle(
    images: torch.Tensor, labels: torch.Tensor, *, name: str, reason: str, classes: tuple[str, ...],
    val_fraction: float, seed: int, limit: int | None, scale: float,
) -> DataBundle:
    """Split, cut the training part to `limit`, and only then convert the kept images to float32 / scale."""
    _check_limit(limit)
    train_idx, val_idx = _split_indices(len(images), val_fraction, seed)
    train_idx = train_idx[:limit]

    def part(idx: torch.Tensor) -> TensorDataset:
        x = images[idx].to(torch.float32).div_(scale)
        return TensorDataset(x.unsqueeze(1) if x.ndim == 3 else x, labels[idx].to(torch.int64))

    train, val = part(train_idx), part(val_idx)
    return DataBundle(train, val, name, reason, len(classes), tuple(train.tensors[0].shape[1:]), classes)


@functools.cache
def _digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits' images (float64 in [0, 16]) and labels, read once per process (the checks ask for the digits
    hundreds of times); `_bundle` indexes them, so every call gets tensors of its own. Read from the file scikit-learn
    bundles, as its `load_digits` reads it, without importing scikit-learn (0.8 s of CPU in every kernel that uses the
    digits); through `load_digits` where that file is not in its place (sklearn/datasets/data/ since 0.20)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    where = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    path = where / "datasets" / "data" / "digits.csv.gz" if where else None
    if path is not None and path.is_file():
        import numpy as np

        with gzip.open(path, "rt") as handle:
            data = np.loadtxt(handle, delimiter=",")
        images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    else:
        from sklearn.datasets import load_digits

        raw = load_digits()
        images, target = raw.images, raw.target
    return torch.as_tensor(images), torch.as_tensor(target)


def digits(val_fraction: float = 0.2, seed: int = 0, limit: int | None = None) -> DataBundle:
    """scikit-learn's bundled digits: 1797 images 1×8×8 scaled to [0, 1], 10 classes, no download.

    Introduced in 06-compile.
    """
    images, labels = _digits_tensors()
    return _bundle(
        images, labels, name="digits", reason="scikit-learn's bundled digits were asked for",
        classes=tuple(str(i) for i in range(10)), val_fraction=val_fraction, seed=seed, limit=limit, scale=16.0,
    )


def _fashion_dir(root: Path) -> Path:
    return root / "FashionMNIST"


def _fashion_state(root: Path) -> str:
    """"complete", "absent" or "partial" (some of torchvision's files there, not all)."""
    raw = _fashion_dir(root) / "raw"
    present = [f for f in FASHION_FILES if (raw / f).is_file()]
    if len(present) == len(FASHION_FILES):
        return "complete"
    leftovers = present or [f for f in FASHION_FILES if (raw / f"{f}.gz").is_file()]
    return "partial" if leftovers else "absent"


def _fetch_fashion(root: Path) -> None:
    """Download Fashion-MNIST into root with torchvision (which checks the archives' MD5 sums)."""
    from torchvision.datasets import FashionMNIST

    FashionMNIST(str(root), train=True, download=True)


def _check_idx_size(folder: Path, path: Path) -> None:
    """Compare an uint8 IDX file's size with the size its header announces (a cut download is shorter)."""
    with open(path, "rb") as f:
        header = f.read(16)
    ndim = header[3] if len(header) >= 4 else 0
    if len(header) < 4 + 4 * ndim or header[2] != 0x08 or not 1 <= ndim <= 3:
        raise DatasetCacheError(folder, f"{path.name} does not start with a uint8 IDX header")
    dims = struct.unpack(f">{ndim}I", header[4 : 4 + 4 * ndim])
    expected = 4 + 4 * ndim + math.prod(dims)
    if path.stat().st_size != expected:
        raise DatasetCacheError(
            folder, f"{path.name} has {path.stat().st_size} bytes where its header announces {expected}"
        )


def _read_fashion(root: Path) -> tuple[Any, Any, tuple[str, ...]]:
    """The training images (uint8 N×28×28), labels and class names; DatasetCacheError when unreadable."""
    from torchvision.datasets import FashionMNIST

    folder = _fashion_dir(root)
    for name in FASHION_FILES[:2]:
        _check_idx_size(folder, folder / "raw" / name)
    try:
        ds = FashionMNIST(str(root), train=True, download=False)
    except Exception as exc:  # noqa: BLE001 - torchvision reports bad files as AssertionError, RuntimeError, ...
        raise DatasetCacheError(folder, f"torchvision could not read it ({type(exc).__name__}: {exc})") from exc
    data, targets = ds.data, ds.targets
    if data.ndim != 3 or tuple(data.shape[1:]) != (28, 28) or len(data) != len(targets) or len(data) == 0:
        raise DatasetCacheError(
            folder, f"expected N×28×28 images with N labels, found images {tuple(data.shape)} and {len(targets)} labels"
        )
    if int(targets.min()) < 0 or int(targets.max()) > 9:
        raise DatasetCacheError(folder, f"labels outside 0-9 (from {int(targets.min())} to {int(targets.max())})")
    return data, targets, tuple(ds.classes)


def fashion_mnist(
    root: str | os.PathLike[str] | None = None,
    download: bool = False,
    val_fraction: float = 0.2,
    seed: int = 0,
    limit: int | None = None,
) -> DataBundle:
    """Fashion-MNIST's 60000 training images (1×28×28 in [0, 1], 10 classes), split into train and val.

    Reads <root>/FashionMNIST/raw/ through torchvision; downloads only with download=True.
    Raises FileNotFoundError when it is absent and DatasetCacheError when the files there are broken.
    """
    root = Path(root) if root is not None else default_root()
    state = _fashion_state(root)
    if state != "complete":
        if not download:
            raw = _fashion_dir(root) / "raw"
            if state == "partial":
                missing = [f for f in FASHION_FILES if not (raw / f).is_file()]
                raise DatasetCacheError(_fashion_dir(root), f"{', '.join(missing)} missing from {raw}")
            raise FileNotFoundError(f"Fashion-MNIST is not in {raw}; pass download=True to download it (about 30 MB).")
        _fetch_fashion(root)
    data, targets, classes = _read_fashion(root)
    return _bundle(
        data, targets, name="Fashion-MNIST", reason=f"Fashion-MNIST was asked for and read from {root}",
        classes=classes, val_fraction=val_fraction, seed=seed, limit=limit, scale=255.0,
    )


def load(
    prefer: str = "auto",
    root: str | os.PathLike[str] | None = None,
    download: bool | None = None,
    val_fraction: float = 0.2,
    seed: int = 0,
    limit: int | None = None,
    *,
    verbose: bool = True,
) -> DataBundle:
    """The course dataset, printing which one and why (also in `.reason`).

    prefer="auto": Fashion-MNIST if it is on disk or can be downloaded, else scikit-learn's digits.
    download=None tries a download only on Colab; True always tries; False never does.
    prefer="fashion_mnist" raises instead of falling back; prefer="digits" never touches the disk.
    `limit` keeps the first `limit` training examples after the split (validation is kept whole).
    A broken Fashion-MNIST cache raises DatasetCacheError rather than falling back.
    Introduced in 01-device.
    """
    choice = prefer.lower().replace("-", "_")
    if choice not in _CHOICES:
        raise ValueError(f"prefer must be one of {', '.join(map(repr, _CHOICES))}; got {prefer!r}")
    _check_limit(limit)
    split_args: dict[str, Any] = dict(val_fraction=val_fraction, seed=seed, limit=limit)
    if choice == "digits":
        bundle = dataclasses.replace(digits(**split_args), reason="prefer='digits' was asked for")
    else:
        root = Path(root) if root is not None else default_root()
        bundle = _load_fashion_or_digits(choice, root, download, split_args)
    if verbose:
        print(bundle.summary())
    return bundle


def _load_fashion_or_digits(choice: str, root: Path, download: bool | None, split_args: dict[str, Any]) -> DataBundle:
    where = _fashion_dir(root) / "raw"
    state = _fashion_state(root)
    if state == "complete":
        bundle = fashion_mnist(root, download=False, **split_args)
        return dataclasses.replace(bundle, reason=f"Fashion-MNIST is on disk in {where}")
    try_download = on_colab() if download is None else download
    if not try_download:
        if choice == "fashion_mnist" or state == "partial":
            return fashion_mnist(root, download=False, **split_args)  # raises with the details
        why = (
            "download=None downloads only on Colab; pass download=True to try"
            if download is None
            else "download=False"
        )
        return dataclasses.replace(
            digits(**split_args), reason=f"Fashion-MNIST is not in {where} and downloading is off ({why})"
        )
    try:
        _fetch_fashion(root)
    except Exception as exc:  # noqa: BLE001 - no network, a proxy, a full disk: all mean "fall back, and say so"
        if state == "partial":
            problem = f"an earlier download stopped halfway and a new one failed ({exc})"
            raise DatasetCacheError(_fashion_dir(root), problem) from exc
        if choice == "fashion_mnist":
            raise
        return dataclasses.replace(
            digits(**split_args),
            reason=f"Fashion-MNIST could not be downloaded to {root} ({type(exc).__name__}: {exc})",
        )
    bundle = fashion_mnist(root, download=False, **split_args)
    return dataclasses.replace(bundle, reason=f"Fashion-MNIST was downloaded to {where}")


def synthetic(n: int, shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 10, seed: int = 0) -> TensorDataset:
    """n random float32 images in [0, 1) and int64 labels, for throughput work: same seed, same tensors.
    """
    if n < 0 or num_classes < 1:
        raise ValueError(f"need n >= 0 and num_classes >= 1, got n={n}, num_classes={num_classes}")
    g = torch.Generator().manual_seed(seed)
    images = torch.rand((n, *shape), generator=g, dtype=torch.float32)
    labels = torch.randint(0, num_classes, (n,), generator=g, dtype=torch.int64)
    return TensorDataset(images, labels)
