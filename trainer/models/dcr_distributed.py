"""DCR fitted data-parallel on a Dask cluster: stratified SGD (DSGD, Gemulla et al., KDD 2011).

Users are split into ``W`` blocks and items into ``W`` blocks (random, balanced by rating
count). An epoch is ``W`` sub-epochs; in sub-epoch ``s`` the stratum of user block ``w`` is
item block ``(w + s) mod W``. The ``W`` strata of a sub-epoch share no user and no item, so
their SGA steps touch disjoint factor rows: running them in parallel gives exactly what the
sequential algorithm gives when it visits the ratings in that order (the stratum order), and
DSGD converges under the same step-size conditions as SGD (Gemulla et al., Theorem 1).

Each stratum is trained by the single-process kernel (``pointwise_epoch_by_user``: the same
``pointwise_step`` with its projection, levels in parallel threads) on the block's own CSR.
The top-N model's unrated items are drawn inside the stratum from its item block only: user
``u`` draws ``unrated_share * n_u * m_b / m`` of them there (``m_b`` the block's share of the
sampling weight), so over an epoch every user gets the single-process fit's count and item
distribution.

Fault tolerance: every stratum task is pure (copies its inputs, returns new blocks), so Dask
may rerun it anywhere (``retries``). The driver holds the factors of the last checkpoint
(every epoch by default); when the engine loses data or a worker, the epochs since are redone
from them (at most ``max_restarts`` times), with the same seeds, so to the same result. The
fitted estimator (and so its artifact) exists only once every epoch has completed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.base import check_finite
from ordrec.trainer.models.dcr import DCR, user_csr
from ordrec.trainer.models.dcr_kernels import pointwise_epoch_by_user, shuffle_segments, with_unrated

LOCAL_PREFIX = "local:"
# Engine failures that redo an epoch from the driver's factors (a lost worker, lost data,
# a dropped connection); anything else (a diverged fit, a bug) is raised at once.
ENGINE_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError)


def engine_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean the engine lost work, not that the fit failed."""
    from distributed import KilledWorker
    from distributed.client import FutureCancelledError

    return (*ENGINE_ERRORS, KilledWorker, FutureCancelledError)


# ------------------------------------------------------------------ blocks
def balanced_blocks(counts: np.ndarray, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Block of every row: rows in a random order cut into ``n_blocks`` runs of about equal
    ``counts`` (ratings), so the strata of a sub-epoch take about equal time."""
    order = rng.permutation(counts.size)
    cumulative = np.cumsum(counts[order], dtype=np.float64)
    total = cumulative[-1] if cumulative.size else 0.0
    block = np.empty(counts.size, dtype=np.int64)
    if total <= 0:
        block[order] = np.arange(counts.size) % n_blocks
        return block
    block[order] = np.minimum((cumulative - 0.5 * counts[order]) * n_blocks // total, n_blocks - 1)
    return block


def strata(n_blocks: int, sub_epoch: int) -> list[tuple[int, int]]:
    """The (user block, item block) pairs of ``sub_epoch``: block ``w`` meets ``(w + s) mod W``."""
    return [(w, (w + sub_epoch) % n_blocks) for w in range(n_blocks)]


@dataclass
class RatingBlock:
    """The ratings of one stratum as a CSR over the block's own rows (users of user block ``w``,
    items of item block ``b``, both numbered from 0 in the order of ``users``/``items``)."""

    indptr: np.ndarray
    items: np.ndarray  # int32, sorted within each user's segment
    levels: np.ndarray
    user_total: np.ndarray  # each block user's training ratings over all item blocks
    item_weight: np.ndarray  # the unrated sampler's weight of each item of the block
    weight_share: float  # the block's share of the whole catalogue's weight


def split_blocks(
    user: np.ndarray,
    item: np.ndarray,
    level: np.ndarray,
    user_block: np.ndarray,
    item_block: np.ndarray,
    item_weight: np.ndarray,
    n_blocks: int,
) -> tuple[list[np.ndarray], list[np.ndarray], dict[tuple[int, int], RatingBlock]]:
    """The rows of every user and item block, and the ``W x W`` rating blocks."""
    users = [np.flatnonzero(user_block == w) for w in range(n_blocks)]
    items = [np.flatnonzero(item_block == b) for b in range(n_blocks)]
    local_user = np.empty(user_block.size, dtype=np.int64)
    local_item = np.empty(item_block.size, dtype=np.int64)
    for rows, in_block in ((users, local_user), (items, local_item)):
        for block in rows:
            in_block[block] = np.arange(block.size)
    user_total = np.bincount(user, minlength=user_block.size)
    total_weight = float(item_weight.sum())
    key = user_block[user] * n_blocks + item_block[item]
    order = np.argsort(key, kind="stable")
    bounds = np.searchsorted(key[order], np.arange(n_blocks * n_blocks + 1))
    blocks = {}
    for w in range(n_blocks):
        for b in range(n_blocks):
            part = order[bounds[w * n_blocks + b] : bounds[w * n_blocks + b + 1]]
            indptr, seg_items, seg_levels = user_csr(
                users[w].size, local_user[user[part]], local_item[item[part]].astype(np.int32), level[part]
            )
            weight = item_weight[items[b]]
            blocks[w, b] = RatingBlock(
                indptr,
                seg_items,
                seg_levels,
                user_total[users[w]],
                weight,
                float(weight.sum()) / total_weight if total_weight > 0 else 0.0,
            )
    return users, items, blocks


# ------------------------------------------------------------------ the stratum task
@dataclass(frozen=True)
class StepParams:
    """What every stratum of an epoch shares: the SGA step and the top-N sampler."""

    lr: float
    reg: float
    floor: float
    u_fixed: int
    u_radius: float
    sphere: bool
    train_levels: np.ndarray
    unrated_share: float


def train_stratum(
    U: np.ndarray, V: np.ndarray, block: RatingBlock, step: StepParams, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """One stratum's SGA pass (``pointwise_epoch_by_user`` on the block's CSR), on copies of
    the block's factors: returns ``(U, V, loglik per level, norms per level, examples)``.

    The visiting order comes from ``numpy.random.default_rng(seed)``: its first draw seeds
    ``shuffle_segments``, its next permutes the block's users (the unrated draws are seeded
    with ``seed`` itself). Pure, so the engine may run it again anywhere, to the same result.
    """
    U, V = U.copy(), V.copy()
    if step.unrated_share > 0 and block.weight_share > 0:
        want = step.unrated_share * block.weight_share * block.user_total.astype(np.float64)
        indptr, items, levels = with_unrated(
            block.indptr, block.items, block.levels, want, np.cumsum(block.item_weight), seed
        )
    else:
        indptr, items, levels = block.indptr, block.items.astype(np.int64), block.levels.copy()
    rng = np.random.default_rng(seed)
    shuffle_segments(indptr, items, levels, int(rng.integers(2**31 - 1)))
    active = np.flatnonzero(np.diff(indptr) > 0)
    loglik, norms = pointwise_epoch_by_user(
        U,
        V,
        indptr,
        items,
        levels,
        rng.permutation(active),
        step.lr,
        step.reg,
        step.floor,
        step.u_fixed,
        step.u_radius,
        step.sphere,
        step.train_levels,
    )
    return U, V, loglik, norms, int(items.size)


# ------------------------------------------------------------------ the fit
class DistributedFit:
    """Fits a :class:`DCR` by DSGD on a Dask ``client`` (or :class:`InProcess`); ``fit(data)``
    returns the estimator fitted as ``DCR.fit`` fits it (same attributes, same artifact).

    ``blocks`` (default: the cluster's worker threads) is ``W``. The initial factors, levels
    and training CSR are the single-process fit's (a fit of 0 epochs); the epochs then run as
    strata on the cluster. Fixed epochs (``max_iter``) and the ``tol`` rule are supported;
    model selection (``EarlyStoppedDCR``), the "random" visiting order and the pairwise refinement are not (a
    ValueError names the option), and ``fit`` takes no validation set.

    The factors stay on the cluster between epochs; every ``checkpoint_every`` epochs (and
    after the last) the driver gathers them, and an engine failure redoes the epochs since
    that checkpoint (``max_restarts`` times at most). Every epoch's seeds depend only on
    ``random_state`` and the epoch, so a redone fit equals an undisturbed one.

    ``on_sub_epoch(epoch, sub_epoch)`` is called on the driver before each sub-epoch's strata
    are submitted (a test kills a worker from it, mid-fit). ``restarts_`` counts the
    epochs redone after an engine failure and ``epoch_seconds_`` times each epoch.
    """

    def __init__(
        self,
        estimator: DCR,
        client,
        *,
        blocks: int | None = None,
        retries: int = 2,
        max_restarts: int = 3,
        checkpoint_every: int = 1,
        on_sub_epoch: Callable[[int, int], None] | None = None,
    ):
        self.estimator = estimator
        self.client = client
        self.blocks = blocks
        self.retries = retries
        self.max_restarts = max_restarts
        self.checkpoint_every = checkpoint_every
        self.on_sub_epoch = on_sub_epoch

    def _check(self, model: DCR) -> None:
        if not isinstance(model, DCR):
            raise ValueError(
                f"the distributed DCR fit takes a plain DCR, not a {type(model).__name__}: the pairwise"
                " refinement and model selection run in one process"
            )
        for name in ("blocks", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    def n_blocks(self) -> int:
        """``W``: as given, else the cluster's worker threads (at least 1)."""
        if self.blocks is not None:
            return int(self.blocks)
        threads = sum(self.client.nthreads().values())
        return max(1, int(threads))

    def fit(self, data: Ratings) -> DCR:
        model = self.estimator
        self._check(model)
        epochs = int(model.max_iter)
        # The single-process fit's set-up: levels, training CSR, popularity, initial factors.
        model.set_params(max_iter=0)
        try:
            model.fit(data)
        finally:
            model.set_params(max_iter=epochs)
        if model.variants_.order != "user":
            raise ValueError('the distributed DCR fit visits ratings by user: variant order must be "user"')
        W = self.n_blocks()
        rng = np.random.default_rng([int(model.random_state), 4])
        # The fit's training CSR: levels as it numbers them ("not rated" is level 0, top-N).
        indptr = model.seen_indptr_
        user = np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))
        item, level = model.seen_indices_.astype(np.int64), model.seen_levels_
        weight = model.item_counts_.astype(np.float64) ** float(model.solver_settings().unrated_power)
        user_block = balanced_blocks(np.diff(model.seen_indptr_), W, rng)
        item_block = balanced_blocks(model.item_counts_, W, rng)
        users, items, blocks = split_blocks(user, item, level, user_block, item_block, weight, W)
        U, V = model.U_, model.V_
        model.loglik_ = np.full(U.shape[1], np.nan)
        model.loglik_history_ = []
        self.restarts_ = 0
        self.epoch_seconds_: list[float] = []
        scattered = self._scatter(blocks)
        factors = self._place(U, V, users, items)
        checkpoint = epoch = 0  # U and V hold the factors after `checkpoint` epochs
        while epoch < epochs:
            t0 = time.perf_counter()
            try:
                factors, stats = self._submit_epoch(factors, scattered, self._step(model, epoch), epoch, W)
                loglik, norms, examples = _summed(self.client.gather(stats))
                check_finite(epoch, loglik=loglik, factor_norms=norms)
                epoch += 1
                model.loglik_ = loglik
                model.loglik_history_.append(float(loglik.sum()) / max(examples, 1))
                last = epoch == epochs or model._converged()
                if last or epoch - checkpoint >= int(self.checkpoint_every):
                    self._collect(U, V, users, items, factors)
                    checkpoint = epoch
            except engine_errors():
                if self.restarts_ >= self.max_restarts:
                    raise
                # Redo from the factors of the last checkpoint, with the rating blocks placed
                # anew (a lost worker takes its copies with it). Every epoch's seeds depend on
                # the epoch alone, so the redone epochs equal the lost ones.
                self.restarts_ += 1
                epoch = checkpoint
                del model.loglik_history_[checkpoint:], self.epoch_seconds_[checkpoint:]
                scattered = self._scatter(blocks)
                factors = self._place(U, V, users, items)
                continue
            self.epoch_seconds_.append(time.perf_counter() - t0)
            if last:
                break
        model.epochs_run_ = len(model.loglik_history_)
        active = np.flatnonzero(np.diff(model.seen_indptr_) > 0)
        check_finite(model.epochs_run_ - 1, user_factors=U[active], item_factors=V)
        if model.init != "marginal":
            V[model.item_counts_ == 0] = 0.0  # items without ratings keep no evidence, as in DCR.fit
        return model

    @staticmethod
    def _step(model: DCR, epoch: int) -> StepParams:
        bias = float(model.variants_.item_bias)
        L = model.U_.shape[1]
        return StepParams(
            lr=float(model.learning_rate)
            / (1.0 + float(model.solver_settings().learning_rate_decay) * epoch),
            reg=float(model.reg),
            floor=float(model.variants_.prob_floor),
            u_fixed=1 if bias else 0,
            u_radius=float(np.sqrt(1.0 - bias * bias)),
            sphere=model.variants_.projection == "sphere",
            train_levels=np.arange(L, dtype=np.int64),
            unrated_share=float(model.unrated_share),
        )

    def _scatter(self, blocks: dict[tuple[int, int], RatingBlock]) -> dict:
        keys = list(blocks)
        futures = self.client.scatter([blocks[k] for k in keys], hash=False)
        return dict(zip(keys, futures))

    def _place(self, U, V, users, items) -> tuple[list, list]:
        """The user and item blocks of the factors, sent to the cluster."""
        W = len(users)
        placed = self.client.scatter([U[rows] for rows in users] + [V[rows] for rows in items], hash=False)
        return placed[:W], placed[W:]

    def _collect(self, U, V, users, items, factors: tuple[list, list]) -> None:
        """Write the cluster's factor blocks into the driver's ``U`` and ``V`` (a checkpoint)."""
        u_blocks, v_blocks = factors
        done = self.client.gather([*u_blocks, *v_blocks])
        for rows, block in zip(users, done[: len(users)]):
            U[rows] = block
        for rows, block in zip(items, done[len(users) :]):
            V[rows] = block

    def _submit_epoch(self, factors: tuple[list, list], scattered, step: StepParams, epoch: int, W: int):
        """Submit the ``W`` sub-epochs of one epoch: the new factor blocks (futures) and each
        stratum's statistics. The blocks stay on the cluster, held where they were computed: a
        user block stays with its chain and an item block moves to the stratum that reads it
        next (DSGD's rotation). Sub-epoch ``s + 1``'s strata depend on sub-epoch ``s``'s
        blocks, so the engine needs no barrier in between."""
        u_blocks, v_blocks = list(factors[0]), list(factors[1])
        seeds = np.random.default_rng([int(self.estimator.random_state), 4, epoch]).integers(
            2**31 - 1, size=(W, W)
        )
        stats = []
        for s in range(W):
            if self.on_sub_epoch is not None:
                self.on_sub_epoch(epoch, s)
            for w, b in strata(W, s):
                out = self.client.submit(
                    train_stratum,
                    u_blocks[w],
                    v_blocks[b],
                    scattered[w, b],
                    step,
                    int(seeds[w, b]),
                    retries=self.retries,
                    pure=False,
                )
                u_blocks[w] = self.client.submit(_pick, out, 0, pure=False)
                v_blocks[b] = self.client.submit(_pick, out, 1, pure=False)
                stats.append(self.client.submit(_stats, out, pure=False))
        return (u_blocks, v_blocks), stats


def _summed(stats: list) -> tuple[np.ndarray, np.ndarray, int]:
    """The strata's log-likelihoods and norms per level, and their examples, summed."""
    loglik = np.sum([ll for ll, _, _ in stats], axis=0)
    norms = np.sum([nr for _, nr, _ in stats], axis=0)
    return loglik, norms, int(sum(n for _, _, n in stats))


def _pick(result: tuple, index: int):
    """One element of a stratum's result (so the factor blocks move on their own)."""
    return result[index]


def _stats(result: tuple) -> tuple[np.ndarray, np.ndarray, int]:
    """A stratum's log-likelihood, norms and example count (small, gathered every sub-epoch)."""
    return result[2], result[3], result[4]


class InProcess:
    """The engine interface ``DistributedFit`` uses (scatter, submit, gather, nthreads), run in
    this process one stratum after the other: the sequential algorithm on DSGD's visiting
    order, which the cluster's result must equal."""

    def scatter(self, values: list, hash: bool = False) -> list:
        return list(values)

    def submit(self, function: Callable, *args, retries: int = 0, pure: bool = False):
        return function(*args)

    def gather(self, values: list) -> list:
        return list(values)

    def nthreads(self) -> dict[str, int]:
        return {"in-process": 1}


# ------------------------------------------------------------------ clusters
def local_cluster_size(address: str) -> int | None:
    """``N`` of ``local:N`` (a LocalCluster of N single-threaded worker processes), else None."""
    if not address.startswith(LOCAL_PREFIX):
        return None
    text = address[len(LOCAL_PREFIX) :]
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"cluster {address!r}: local:N needs a positive worker count N, e.g. local:2")
    return int(text)


@contextlib.contextmanager
def cluster_client(address: str) -> Iterator:
    """A Dask client of the scheduler at ``address`` (``tcp://host:8786``), or of a local
    cluster of ``N`` single-threaded worker processes (``local:N``, started and stopped here).
    Each local worker runs numba on one thread: one CPU per worker."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise ValueError("the distributed fit needs Dask: pip install 'ordrec[distributed]'") from exc
    n = local_cluster_size(address)
    if n is None:
        try:
            client = Client(address, timeout="30s")
        except (OSError, TimeoutError) as exc:
            raise ValueError(f"cluster {address!r} is unreachable: {type(exc).__name__}: {exc}") from exc
        with client:
            yield client
        return
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with (
        LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0", env=env
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def check_cluster(kind: str, address: str) -> None:
    """A ValueError unless models of ``kind`` can fit on ``address``: DCR only, and a
    well-formed ``local:N`` (checked before any data is read)."""
    if kind != DCR.kind:
        raise ValueError(f"the distributed fit is for dcr models, not {kind}")
    local_cluster_size(address)


def fit_on_cluster(estimator, data: Ratings, address: str) -> DCR:
    """``estimator.fit(data)`` by DSGD on the cluster at ``address`` (``cluster_client``), as
    ``ordrec-train train dcr --cluster`` and a job's ``cluster`` key do; an unreachable
    scheduler is a ValueError naming the address."""
    check_cluster(getattr(estimator, "kind", type(estimator).__name__), address)
    with cluster_client(address) as client:
        return DistributedFit(estimator, client).fit(data)
