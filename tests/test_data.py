"""course.data: digits offline, Fashion-MNIST from torchvision's on-disk layout (a small fake written here:
no network), a fallback that always says why, deterministic splits, `limit`, and clear cache errors."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset, TensorDataset

from course import data
from course.data import DatasetCacheError

REPO = Path(__file__).resolve().parent.parent


def _write_idx(path: Path, array: torch.Tensor) -> None:
    """Write a uint8 tensor in the IDX format that torchvision's MNIST readers parse."""
    header = struct.pack(">I", 0x0800 | array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.to(torch.uint8).contiguous().numpy().tobytes())


def _fake_fashion(root: Path, n: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Write a tiny Fashion-MNIST into root/FashionMNIST/raw; return its training images and labels."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (n,), generator=g, dtype=torch.uint8)
    for prefix in ("train", "t10k"):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return images, labels


def _images(ds: TensorDataset) -> torch.Tensor:
    return ds.tensors[0]


def test_digits_shapes_ranges_and_dtypes():
    bundle = data.digits()
    assert bundle.name == "digits" and bundle.num_classes == 10 and bundle.input_shape == (1, 8, 8)
    x, y = bundle.train.tensors
    assert len(bundle.train) + len(bundle.val) == 1797
    assert len(bundle.val) == round(1797 * 0.2)
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape[1:] == (1, 8, 8)
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert set(y.tolist()) == set(range(10))


def test_each_digits_call_gets_tensors_of_its_own():
    """The file is read once per process, but a bundle changed in place (a learner normalising the images, labels
    overwritten) changes neither the next call's data nor an earlier bundle's."""
    first, second = data.digits(), data.digits()
    kept = [t.clone() for t in (*first.train.tensors, *first.val.tensors)]
    for t in (*second.train.tensors, *second.val.tensors):
        t.zero_()
    third = data.digits()
    assert all(torch.equal(a, b) for a, b in zip(kept, (*first.train.tensors, *first.val.tensors), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(kept, (*third.train.tensors, *third.val.tensors), strict=True))
    limited = data.digits(limit=100)
    assert torch.equal(limited.train.tensors[0], kept[0][:100])


def test_split_is_deterministic_and_disjoint():
    ds = TensorDataset(torch.arange(100), torch.arange(100) % 7)
    train_a, val_a = data.split(ds, 0.25, seed=3)
    train_b, val_b = data.split(ds, 0.25, seed=3)
    train_c, _ = data.split(ds, 0.25, seed=4)
    assert torch.equal(train_a.tensors[0], train_b.tensors[0]) and torch.equal(val_a.tensors[0], val_b.tensors[0])
    assert not torch.equal(train_a.tensors[0], train_c.tensors[0])
    together = torch.cat([train_a.tensors[0], val_a.tensors[0]]).sort().values
    assert torch.equal(together, torch.arange(100)) and len(val_a) == 25
    assert torch.equal(train_a.tensors[1], train_a.tensors[0] % 7)  # rows stay paired


def test_split_of_a_plain_dataset_gives_subsets_and_checks_the_fraction():
    train, val = data.split(list(range(10)), 0.3, seed=0)
    assert isinstance(train, Subset) and sorted(list(train) + list(val)) == list(range(10))
    with pytest.raises(ValueError, match="val_fraction"):
        data.split(list(range(10)), 1.0)


def test_load_falls_back_to_digits_and_says_why(tmp_path, capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    bundle = data.load(root=tmp_path)
    out = capsys.readouterr().out
    assert bundle.name == "digits"
    assert str(tmp_path) in bundle.reason and "download=True" in bundle.reason
    assert bundle.reason in out and "Dataset: digits" in out
    bundle = data.load(root=tmp_path, download=False, verbose=False)
    assert "download=False" in bundle.reason and capsys.readouterr().out == ""


def test_load_same_seed_same_split_and_limit_keeps_the_first_n(tmp_path):
    a = data.load("digits", seed=5, verbose=False)
    b = data.load("digits", seed=5, verbose=False)
    c = data.load("digits", seed=6, verbose=False)
    assert torch.equal(_images(a.train), _images(b.train)) and torch.equal(_images(a.val), _images(b.val))
    assert not torch.equal(_images(a.train), _images(c.train))
    small = data.load("digits", seed=5, limit=64, verbose=False)
    assert torch.equal(_images(small.train), _images(a.train)[:64])
    assert torch.equal(_images(small.val), _images(a.val))
    with pytest.raises(ValueError, match="limit"):
        data.load("digits", limit=0, verbose=False)
    with pytest.raises(ValueError, match="prefer"):
        data.load("mnist", verbose=False)


def test_fashion_mnist_is_read_from_torchvisions_layout(tmp_path, capsys):
    images, labels = _fake_fashion(tmp_path, n=50)
    bundle = data.load(root=tmp_path, val_fraction=0.2, seed=1)
    assert bundle.name == "Fashion-MNIST" and bundle.input_shape == (1, 28, 28) and bundle.num_classes == 10
    assert "on disk" in bundle.reason and "Fashion-MNIST" in capsys.readouterr().out
    assert len(bundle.train) == 40 and len(bundle.val) == 10
    assert bundle.classes[0] == "T-shirt/top"
    # Every returned image is one of the fake images, scaled to [0, 1], with its own label.
    x, y = bundle.train.tensors
    train_idx, _ = data._split_indices(50, 0.2, seed=1)
    assert torch.equal(x[:, 0], images[train_idx].float() / 255)
    assert torch.equal(y, labels[train_idx].long())
    limited = data.fashion_mnist(tmp_path, val_fraction=0.2, seed=1, limit=5)
    assert torch.equal(limited.train.tensors[0], x[:5])


def test_explicit_fashion_mnist_without_data_raises_instead_of_falling_back(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=True"):
        data.load("fashion-mnist", root=tmp_path, download=False, verbose=False)


def test_truncated_file_raises_a_cache_error_naming_the_folder(tmp_path):
    _fake_fashion(tmp_path, n=50)
    image_file = tmp_path / "FashionMNIST" / "raw" / "train-images-idx3-ubyte"
    image_file.write_bytes(image_file.read_bytes()[:1000])  # as a download cut short would leave it
    with pytest.raises(DatasetCacheError) as info:
        data.load(root=tmp_path, verbose=False)
    message = str(info.value)
    assert str(tmp_path / "FashionMNIST") in message and "rm -rf" in message and "shutil.rmtree" in message
    assert info.value.path == tmp_path / "FashionMNIST"
    assert "train-images-idx3-ubyte has 1000 bytes" in message


def test_garbage_file_raises_a_cache_error(tmp_path):
    _fake_fashion(tmp_path, n=5)
    (tmp_path / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte").write_bytes(b"<html>Service unavailable</html>")
    with pytest.raises(DatasetCacheError, match="train-labels-idx1-ubyte does not start with"):
        data.fashion_mnist(tmp_path)


def test_mismatched_labels_raise_a_cache_error(tmp_path):
    _fake_fashion(tmp_path, n=50)
    _write_idx(tmp_path / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte", torch.zeros(49, dtype=torch.uint8))
    with pytest.raises(DatasetCacheError, match="50 labels|49 labels"):
        data.fashion_mnist(tmp_path)


def test_partial_cache_raises_a_cache_error_listing_missing_files(tmp_path):
    _fake_fashion(tmp_path, n=10)
    (tmp_path / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetCacheError, match="t10k-labels-idx1-ubyte"):
        data.load(root=tmp_path, download=False, verbose=False)


def test_failed_download_falls_back_and_says_so(tmp_path, monkeypatch):
    def no_network(root: Path) -> None:
        raise OSError("Name or service not known")

    monkeypatch.setattr(data, "_fetch_fashion", no_network)
    bundle = data.load(root=tmp_path, download=True, verbose=False)
    assert bundle.name == "digits" and "could not be downloaded" in bundle.reason and "Name or service" in bundle.reason
    with pytest.raises(OSError):
        data.load("fashion_mnist", root=tmp_path, download=True, verbose=False)


def test_download_none_tries_on_colab_only(tmp_path, monkeypatch):
    calls: list[Path] = []

    def fetch(root: Path) -> None:
        calls.append(root)
        _fake_fashion(root, n=20)

    monkeypatch.setattr(data, "_fetch_fashion", fetch)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert data.load(root=tmp_path, verbose=False).name == "digits" and calls == []
    monkeypatch.setitem(sys.modules, "google.colab", object())
    bundle = data.load(root=tmp_path, verbose=False)
    assert calls == [tmp_path] and bundle.name == "Fashion-MNIST" and "downloaded" in bundle.reason


def test_synthetic_is_seeded_and_shaped():
    a, b = data.synthetic(16, (3, 4, 4), seed=1), data.synthetic(16, (3, 4, 4), seed=1)
    c = data.synthetic(16, (3, 4, 4), seed=2)
    assert torch.equal(a.tensors[0], b.tensors[0]) and not torch.equal(a.tensors[0], c.tensors[0])
    x, y = a.tensors
    assert x.shape == (16, 3, 4, 4) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0 <= float(x.min()) and float(x.max()) < 1 and int(y.max()) < 10


def test_default_root_honours_course_data(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    assert data.default_root() == tmp_path


def test_import_course_data_does_not_import_torchvision_or_sklearn():
    """Neither importing course.data nor reading the digits imports them (scikit-learn alone costs a kernel 0.8 s)."""
    code = ("import sys, course.data; course.data.digits(); "
            "print([m for m in ('torchvision', 'sklearn', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_digits_are_what_scikit_learn_loads():
    """Read from scikit-learn's bundled file directly, the images and labels are load_digits' own, in order."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    images, labels = data._digits_tensors()
    assert torch.equal(images, torch.as_tensor(raw.images)) and torch.equal(labels, torch.as_tensor(raw.target))
