"""read_torch_checkpoint: torch.save'd state dicts → numpy, without torch (torch is test-only)."""

import collections
import pickle
import zipfile

import ml_dtypes
import numpy as np
import pytest

from rynn_jax.torch_pickle import TorchCheckpointError, read_torch_checkpoint

torch = pytest.importorskip("torch")  # writes the checkpoints read here


def _state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    return collections.OrderedDict(
        w32=torch.randn(3, 4, 2, generator=g),
        w16=torch.randn(5, 3, generator=g).half(),
        wbf16=torch.randn(2, 7, generator=g).to(torch.bfloat16),
        step=torch.tensor(7, dtype=torch.int64),
        transposed=base.t(),  # non-contiguous view
        row=base[2],  # view at a storage offset, sharing storage with `transposed`
        param=torch.nn.Parameter(torch.randn(3, generator=g)),
        empty=torch.zeros(0, 4),
        mask=torch.tensor([True, False, True]),
    )


def _expected(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_roundtrip_matches_torch(tmp_path, zip_format):
    sd = _state_dict()
    path = tmp_path / "ckpt.pth"
    torch.save(sd, path, _use_new_zipfile_serialization=zip_format)
    got = read_torch_checkpoint(path)
    assert list(got) == list(sd)
    for k, t in sd.items():
        want = _expected(t)
        assert got[k].dtype == want.dtype, k
        assert got[k].shape == want.shape, k
        np.testing.assert_array_equal(got[k], want, err_msg=k)
    assert got["wbf16"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_unwraps_state_dict_and_drops_non_tensors(tmp_path):
    sd = _state_dict()
    path = tmp_path / "wrapped.pt"
    torch.save({"state_dict": sd}, path)
    assert list(read_torch_checkpoint(path)) == list(sd)
    torch.save({"a": torch.ones(2), "epoch": 3}, path)
    assert list(read_torch_checkpoint(path)) == ["a"]


def test_refuses_arbitrary_globals(tmp_path):
    good = tmp_path / "good.pth"
    torch.save({"a": torch.ones(2)}, good)
    bad = tmp_path / "bad.pth"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):  # a pickle that would call os.system on load
                data = b"cos\nsystem\n(S'echo pwned'\ntR."
            dst.writestr(info, data)
    with pytest.raises(TorchCheckpointError, match="os.system"):
        read_torch_checkpoint(bad)
    other = tmp_path / "counter.pth"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(collections.Counter(a=1)))
    with pytest.raises(TorchCheckpointError, match="Counter"):
        read_torch_checkpoint(other)


def test_missing_or_garbage_file(tmp_path):
    with pytest.raises(TorchCheckpointError, match="not found"):
        read_torch_checkpoint(tmp_path / "nope.pth")
    (tmp_path / "junk.pth").write_bytes(b"\x00not a checkpoint")
    with pytest.raises(TorchCheckpointError, match="junk.pth"):
        read_torch_checkpoint(tmp_path / "junk.pth")
