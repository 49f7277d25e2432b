"""Reading memory-mapped arrays through their files (service/storage/mapped.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.mapped import FileRows, row_blocks


def _memmap(tmp_path, array: np.ndarray, header: int = 0) -> np.memmap:
    """``array`` written after ``header`` bytes and mapped back (an offset, as in .npy files)."""
    path = tmp_path / f"a{array.dtype}{header}.bin"
    with open(path, "wb") as fh:
        fh.write(b"x" * header)
        array.tofile(fh)
    return np.memmap(path, dtype=array.dtype, mode="r", offset=header, shape=array.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.integers(0, 49), max_size=60), header=st.sampled_from([0, 8, 128]))
def test_file_rows_match_indexing_in_any_order_with_repeats(tmp_path_factory, dtype, rows, header):
    array = np.random.default_rng(len(rows)).standard_normal((50, 7)).astype(dtype)
    reader = FileRows(_memmap(tmp_path_factory.mktemp("m"), array, header))
    picked = np.array(rows, dtype=np.int64)
    got = reader.take(picked)
    assert got.dtype == array.dtype and got.shape == (len(rows), 7)
    assert np.array_equal(got, array[picked])


def test_file_rows_of_an_array_in_memory_index_it(tmp_path):
    array = np.arange(12.0).reshape(4, 3)
    assert np.array_equal(FileRows(array).take(np.array([3, 0])), array[[3, 0]])


def test_a_file_shorter_than_its_array_is_refused(tmp_path):
    array = np.ones((10, 4), np.float32)
    view = _memmap(tmp_path, array)
    reader = FileRows(view)
    with open(view.filename, "r+b") as fh:
        fh.truncate(5 * 4 * 4 + 3)  # five whole rows and part of the sixth
    assert np.array_equal(reader.take(np.array([4, 0])), array[[4, 0]])
    for rows in ([5], [0, 9]):
        with pytest.raises(ArtifactError, match="shorter"):
            reader.take(np.array(rows))


def test_row_blocks_read_the_whole_array_through_the_file(tmp_path):
    array = np.random.default_rng(0).standard_normal((1000, 5)).astype(np.float32)
    blocks = list(row_blocks(_memmap(tmp_path, array, header=16), block_bytes=1000))
    assert len(blocks) > 1 and np.array_equal(np.concatenate(blocks), array)


def test_warm_up_compiles_the_row_reader():
    # In a fresh process: here the tests above have compiled it already.
    code = (
        "from ordrec.service.storage import mapped; assert not mapped._read_rows.signatures; mapped.warm_up(); "
        "print(len(mapped._read_rows.signatures))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2"]  # float32 and float64 rows
