"""The DataError a reader raises, for tests that check its message (file, line, what to do)."""

from __future__ import annotations

import pytest

from ordrec.trainer.data.types import DataError


def error_of(fn, *args, **kwargs) -> DataError:
    """The DataError ``fn(*args, **kwargs)`` raises (the test fails when it raises none)."""
    with pytest.raises(DataError) as info:
        fn(*args, **kwargs)
    return info.value
