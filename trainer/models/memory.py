"""The memory a fit will need, predicted before it starts, against the memory the process has.

Each kind may register a predictor (``ModelKind.memory``: ``function(estimator, data)`` giving
a :class:`MemoryPrediction` from the data's shape and the settings that multiply it). Before a
fit, :func:`check_fit_memory` compares the prediction with the smallest of the address-space
headroom under ``RLIMIT_AS``, the memory cgroup's headroom (v2 or v1) and ``MemAvailable``, and
stops a fit that cannot fit with :class:`FitTooLarge`, naming both figures and what to change,
instead of letting the kernel kill it or an allocation fail midway.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numba

from ordrec.service.indices.models import kinds

GB = 1e9

# The resident memory the kernels add once per process: the OpenMP runtime and its threads
# (22 MB measured) and, without a warm numba cache, compiling them (about 45 MB measured); and
# the address space each kernel thread reserves besides (its 8 MB stack and a 64 MB malloc
# arena), which only RLIMIT_AS counts.
KERNEL_RUNTIME = 64 << 20
THREAD_RESERVE = 72 << 20
# Above the arrays: freed ones that malloc keeps for reuse (below its mmap threshold, which
# rises to 32 MB) and small temporaries not counted; measured up to 1.3% above the arrays.
MARGIN = 0.1


def kernel_threads_reserve() -> int:
    """The address space the numba kernels' threads reserve (counted against RLIMIT_AS only)."""
    return THREAD_RESERVE * numba.get_num_threads()


@dataclass(frozen=True)
class MemoryPrediction:
    """A fit's predicted peak: the bytes it adds above what the process holds when it starts."""

    peak: int  # resident bytes at the fit's peak (the data already read not included)
    shape: str  # what it was predicted from, e.g. "20,000 users x 2,000 items, 5 levels, 50 dimensions"
    remedies: str  # what to change when it does not fit
    parts: dict[str, int] = field(default_factory=dict)  # the largest terms by name, for the message
    # Address space reserved but not made resident (the kernels' thread stacks and malloc
    # arenas): it counts against RLIMIT_AS only.
    reserved: int = 0
    # The arrays held at the peak of each phase (the fit, its hold-outs, the artifact), before
    # any margin: what docs compare with measured peaks.
    phases: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Limit:
    """Memory available to the process under one limit."""

    name: str
    available: int
    address_space: bool = False  # RLIMIT_AS: reservations count too


class FitTooLarge(ValueError):
    """A fit predicted to need more memory than the process has (a usage error: change the settings)."""


def gigabytes(n: float) -> str:
    """``n`` bytes as "21.5 GB" (three significant figures below 10 GB)."""
    return f"{n / GB:.3g} GB" if n < 10 * GB else f"{n / GB:.1f} GB"


def _status_bytes(key: str) -> int:
    """A ``kB`` figure of /proc/self/status (``VmSize``, ``VmRSS``, ...) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _address_space_limit() -> Limit | None:
    """RLIMIT_AS less the address space the process maps now (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    return Limit("address space left under RLIMIT_AS", soft - _status_bytes("VmSize"), address_space=True)


# cgroup v1 writes "no limit" as the largest page-aligned int64.
_UNLIMITED_V1 = 1 << 62


def _memory_cgroup(root: Path, membership: Path) -> tuple[Path, Path, str, str] | None:
    """The process's memory cgroup: its folder, the hierarchy's top, and the names of the
    limit and usage files (v1's ``memory`` controller, else v2's unified hierarchy)."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    entries = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    for _, controllers, path in entries:
        if "memory" in controllers.split(","):
            top = root / "memory"
            return top / path.lstrip("/"), top, "memory.limit_in_bytes", "memory.usage_in_bytes"
    for hierarchy, controllers, path in entries:
        if hierarchy == "0" and not controllers:
            return root / path.lstrip("/"), root, "memory.max", "memory.current"
    return None


def cgroup_limit(
    root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> Limit | None:
    """The least limit-less-usage of the process's memory cgroup and its ancestors (v2
    ``memory.max - memory.current``, v1 ``memory.limit_in_bytes - memory.usage_in_bytes``);
    None when none sets a limit."""
    found = _memory_cgroup(root, membership)
    if found is None:
        return None
    folder, top, limit_file, usage_file = found
    best = None
    while True:
        try:
            text = (folder / limit_file).read_text().strip()
            limit = None if text == "max" else int(text)
            left = (
                None
                if limit is None or limit >= _UNLIMITED_V1
                else limit - int((folder / usage_file).read_text())
            )
        except (OSError, ValueError):
            left = None
        if left is not None and (best is None or left < best):
            best = left
        if folder == top or top not in folder.parents:
            break
        folder = folder.parent
    return None if best is None else Limit(f"cgroup {limit_file} headroom", best)


def _meminfo_limit() -> Limit | None:
    """``MemAvailable`` of /proc/meminfo: what the machine can give without swapping."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return Limit("MemAvailable", int(line.split()[1]) * 1024)
    except OSError:
        pass
    return None


def memory_limits() -> list[Limit]:
    """Every limit that applies to this process now (address space, cgroup, the machine's)."""
    return [x for x in (_address_space_limit(), cgroup_limit(), _meminfo_limit()) if x is not None]


def predict_fit_memory(kind: str, estimator: Any, data: Any) -> MemoryPrediction | None:
    """The registered prediction of fitting ``estimator`` (what ``configure`` built) on ``data``;
    None when ``kind`` registers no predictor. A wrapper that checks each of its own fits (the
    settings tuner: ``checks_each_fit``) is predicted by the estimator it wraps, its first fit."""
    while getattr(estimator, "checks_each_fit", False):
        estimator = estimator.estimator
    predictor = kinds.get(kind).memory_predictor()
    return None if predictor is None else predictor(estimator, data)


def check_fit_memory(kind: str, estimator: Any, data: Any) -> MemoryPrediction | None:
    """Stop (:class:`FitTooLarge`) a fit predicted to need more than some limit leaves; the
    prediction otherwise (None for a kind without a predictor)."""
    prediction = predict_fit_memory(kind, estimator, data)
    if prediction is None:
        return None
    for limit in memory_limits():
        need = prediction.peak + (prediction.reserved if limit.address_space else 0)
        if need > limit.available:
            raise FitTooLarge(too_large_message(kind, prediction, need, limit))
    return prediction


def too_large_message(kind: str, prediction: MemoryPrediction, need: int, limit: Limit) -> str:
    """What a stopped fit says: the predicted figure, its largest parts, what is available, what to change."""
    parts = ", ".join(f"{name} {gigabytes(size)}" for name, size in prediction.parts.items())
    return (
        f"this {kind} fit needs about {gigabytes(need)} of memory, predicted for {prediction.shape}"
        f" ({parts}), and {gigabytes(max(limit.available, 0))} is available ({limit.name}):"
        f" {prediction.remedies}; or a bigger machine. To fit anyway: ordrec-train train"
        " --no-memory-check, or memory_check = false in the job's model table."
    )
