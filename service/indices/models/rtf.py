"""RTF serving index: top-N tags for a (user, item) post, with cold-start fallbacks.

Fast path (Rendle et al. 2009, Section 4.4.1): for a post (u, i)

    M = C x1 U[u]            (kI x kT), cached per user (bounded LRU)
    q = M^T I[i]             = C x1 U[u] x2 I[i], kT values
    y = T @ q                every tag's score, O(|T| kT)

then a single-pass top-k; all three products run in ``service.indices.topk``'s
kernels, which keep the GIL for short work (see there). Cost
O(|T| kT + kU kI kT) per request, O(|T| kT + kI kT) with a warm user cache,
independent of the number of users, items and observations.

Ids on the wire are the data's external tag ids (Last.fm ``tagID``); when the
data has display names they ship as UTF-8 bytes plus offsets and
``tag_names(rows)`` returns them, so a client can show names without the data.

Cold start (the reply's ``fallback``):

- user and item known: "none", the model's scores;
- unknown user, known item: "popular_item", the item's tags by number of
  training posts, ties and the rest of the list by global popularity;
- unknown item, known user: "popular_user", the same with the user's tags;
- both unknown: "popular_global", tags by number of training posts.

Popularity scores are counts plus a global tie-break below one, so they are
higher-is-better like the model's.

What answers a known (user, item) is the artifact's ``serves`` attribute:
"rtf" (the factors, the default) or "pop-mix" (the item/user popularity mix at
the artifact's ``mix_weight``), written when the trainer's ``grid_validation``
found no RTF that clearly beats the mix on validation posts. The reply's
fallback stays "none" either way: it is the model the trainer chose.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ordrec.service.indices.models.base import ModelIndex, check_finite
from ordrec.service.indices.topk import affine_scores, top_k
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.idmap import IdMap

FALLBACKS = ("none", "popular_global", "popular_item", "popular_user")
SERVES = ("rtf", "pop-mix")


def score_posts(
    core: np.ndarray, user_vecs: np.ndarray, item_vecs: np.ndarray, tag_factors: np.ndarray, chunk: int = 256
) -> np.ndarray:
    """Scores of every tag for a batch of posts, shape (n_posts, n_tags).

    ``user_vecs[n]`` and ``item_vecs[n]`` are the factor rows of post ``n``.
    Batched form of the fast path; the trainer's validation and the
    evaluation protocol score through it.
    """
    kU, kI, kT = core.shape
    C2 = core.reshape(kU, kI * kT)
    n = user_vecs.shape[0]
    out = np.empty((n, tag_factors.shape[0]), dtype=np.result_type(core, tag_factors))
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        M = (user_vecs[lo:hi] @ C2).reshape(hi - lo, kI, kT)
        q = np.einsum("nb,nbc->nc", item_vecs[lo:hi], M)
        out[lo:hi] = q @ tag_factors.T
    return out


class _LRU:
    """A bounded, thread-safe least-recently-used cache of per-user matrices."""

    def __init__(self, capacity: int):
        self.capacity = max(int(capacity), 0)
        self._data: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: int) -> np.ndarray | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: int, value: np.ndarray) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class RTFIndex(ModelIndex):
    """Tags for a post; see the module docstring."""

    kind = "rtf"
    rpcs = frozenset({"Tags"})
    #: default number of users whose ``C x1 U[u]`` stays cached (kI*kT*4 bytes each)
    DEFAULT_CACHE_USERS = 1024

    def __init__(self, artifact: Artifact, cache_users: int | None = None):
        super().__init__(artifact)
        self.users: IdMap = artifact.idmap("users")
        self.items: IdMap = artifact.idmap("items")
        self.tags_ids: IdMap = artifact.idmap("tags")
        a = artifact.array
        self.core = np.ascontiguousarray(a("core"), dtype=np.float32)
        self.user_factors = np.ascontiguousarray(a("user_factors"), dtype=np.float32)
        self.item_factors = np.ascontiguousarray(a("item_factors"), dtype=np.float32)
        self.tag_factors = np.ascontiguousarray(a("tag_factors"), dtype=np.float32)
        self.tag_popularity = np.asarray(a("tag_popularity"), dtype=np.float32)
        self.user_tag_indptr = np.asarray(a("user_tag_indptr"), dtype=np.int64)
        self.user_tag_indices = np.asarray(a("user_tag_indices"), dtype=np.int64)
        self.user_tag_counts = np.asarray(a("user_tag_counts"), dtype=np.float32)
        self.item_tag_indptr = np.asarray(a("item_tag_indptr"), dtype=np.int64)
        self.item_tag_indices = np.asarray(a("item_tag_indices"), dtype=np.int64)
        self.item_tag_counts = np.asarray(a("item_tag_counts"), dtype=np.float32)
        self.post_indptr = np.asarray(a("post_indptr"), dtype=np.int64)
        self.post_items = np.asarray(a("post_items"), dtype=np.int64)
        self.post_tag_indptr = np.asarray(a("post_tag_indptr"), dtype=np.int64)
        self.post_tags = np.asarray(a("post_tags"), dtype=np.int64)
        self.serves = str(artifact.attributes.get("serves", "rtf"))
        self.mix_weight = float(artifact.attributes.get("mix_weight", 0.5))
        self._validate()
        kU, kI, kT = self.core.shape
        # rows (c, a), columns b: C x1 U[u] comes out transposed, (kT, kI), ready for q = M^T I[i]
        self._core_by_user = np.ascontiguousarray(
            self.core.transpose(2, 1, 0).reshape(kT * kI, kU), dtype=np.float32
        )
        self.dims = (kU, kI, kT)
        # global tie-break for popularity lists, strictly below one count
        self._global_tiebreak = self.tag_popularity / (float(self.tag_popularity.max(initial=0.0)) + 1.0)
        self._names: list[str] | None = None
        if "tag_name_bytes" in artifact.arrays:
            raw = bytes(np.asarray(a("tag_name_bytes"), dtype=np.uint8))
            off = np.asarray(a("tag_name_offsets"), dtype=np.int64)
            if off.shape != (len(self.tags_ids) + 1,):
                raise ArtifactError(f"{artifact.describe()}: tag_name_offsets does not match the tags")
            self._names = [raw[off[t] : off[t + 1]].decode("utf-8") for t in range(len(self.tags_ids))]
        self.cache = _LRU(self.DEFAULT_CACHE_USERS if cache_users is None else cache_users)

    def _validate(self) -> None:
        d = self.artifact.describe()
        if self.core.ndim != 3:
            raise ArtifactError(f"{d}: core must be 3-D, got shape {self.core.shape}")
        kU, kI, kT = self.core.shape
        expect: dict[str, tuple[np.ndarray, tuple[int, ...]]] = {
            "user_factors": (self.user_factors, (len(self.users), kU)),
            "item_factors": (self.item_factors, (len(self.items), kI)),
            "tag_factors": (self.tag_factors, (len(self.tags_ids), kT)),
            "tag_popularity": (self.tag_popularity, (len(self.tags_ids),)),
            "user_tag_indptr": (self.user_tag_indptr, (len(self.users) + 1,)),
            "item_tag_indptr": (self.item_tag_indptr, (len(self.items) + 1,)),
            "post_indptr": (self.post_indptr, (len(self.users) + 1,)),
            "post_tag_indptr": (self.post_tag_indptr, (self.post_items.shape[0] + 1,)),
        }
        for name, (array, shape) in expect.items():
            if array.shape != shape:
                raise ArtifactError(f"{d}: {name} has shape {array.shape}, expected {shape}")
        if self.serves not in SERVES:
            raise ArtifactError(f"{d}: serves must be one of {SERVES}, got {self.serves!r}")
        if not 0.0 <= self.mix_weight <= 1.0:
            raise ArtifactError(f"{d}: mix_weight must be in [0, 1], got {self.mix_weight}")
        for name in ("core", "user_factors", "item_factors", "tag_factors"):
            check_finite(name, getattr(self, name))
        n_tags = len(self.tags_ids)
        for name in ("user_tag_indices", "item_tag_indices", "post_tags"):
            rows = getattr(self, name)
            if rows.size and (rows.min() < 0 or rows.max() >= n_tags):
                raise ArtifactError(f"{d}: {name} holds tag rows outside 0..{n_tags - 1}")
        if self.post_items.size and (self.post_items.min() < 0 or self.post_items.max() >= len(self.items)):
            raise ArtifactError(f"{d}: post_items holds item rows outside the items")

    # ------------------------------------------------------------ fast path
    def user_core(self, user_row: int) -> np.ndarray:
        """``M = C x1 U[u]`` transposed, a (kT, kI) matrix, from the LRU cache when warm."""
        cached = self.cache.get(user_row)
        if cached is not None:
            return cached
        _, kI, kT = self.dims
        m_t = affine_scores(self._core_by_user, self.user_factors[user_row]).reshape(kT, kI)
        self.cache.put(user_row, m_t)
        return m_t

    def scores(self, user_row: int, item_row: int) -> np.ndarray:
        """Every tag's score ``y(u, i, :) = T @ (C x1 U[u] x2 I[i])`` (float32, new array),
        or the popularity mix when the artifact serves "pop-mix"."""
        if self.serves == "pop-mix":
            return self.popular_scores("mix", user_row, item_row, mix_weight=self.mix_weight)
        q = affine_scores(self.user_core(user_row), self.item_factors[item_row])
        return affine_scores(self.tag_factors, q)

    def score_posts(self, user_rows: np.ndarray, item_rows: np.ndarray) -> np.ndarray:
        """Batched ``scores`` for many posts (evaluation), shape (n, n_tags)."""
        if self.serves == "pop-mix":
            return np.array([self.scores(int(u), int(i)) for u, i in zip(user_rows, item_rows)]).reshape(
                -1, len(self.tags_ids)
            )
        return score_posts(
            self.core,
            self.user_factors[np.asarray(user_rows)],
            self.item_factors[np.asarray(item_rows)],
            self.tag_factors,
        )

    def own_tags(self, user_row: int, item_row: int) -> np.ndarray:
        """Tag rows the user put on that item in the training data (empty if none)."""
        lo, hi = self.post_indptr[user_row], self.post_indptr[user_row + 1]
        pos = lo + np.searchsorted(self.post_items[lo:hi], item_row)
        if pos < hi and self.post_items[pos] == item_row:
            return self.post_tags[self.post_tag_indptr[pos] : self.post_tag_indptr[pos + 1]]
        return np.empty(0, dtype=np.int64)

    # ------------------------------------------------------------ popularity
    def popular_scores(
        self, kind: str, user_row: int = -1, item_row: int = -1, *, mix_weight: float = 0.5
    ) -> np.ndarray:
        """Dense popularity scores of every tag (higher is better).

        ``kind`` is "global", "item", "user" (counts in that item's / user's
        training posts, ties broken by global popularity) or "mix"
        (``mix_weight`` times the item's tag shares plus ``1 - mix_weight``
        times the user's, plus the global tie-break scaled below any share
        difference that a count can make; 0.5 is the plain mean).
        """
        if kind == "global":
            return self.tag_popularity.copy()
        if kind == "item":
            return (
                self._owner_counts(
                    self.item_tag_indptr, self.item_tag_indices, self.item_tag_counts, item_row
                )
                + self._global_tiebreak
            )
        if kind == "user":
            return (
                self._owner_counts(
                    self.user_tag_indptr, self.user_tag_indices, self.user_tag_counts, user_row
                )
                + self._global_tiebreak
            )
        if kind == "mix":
            item = self._owner_counts(
                self.item_tag_indptr, self.item_tag_indices, self.item_tag_counts, item_row
            )
            user = self._owner_counts(
                self.user_tag_indptr, self.user_tag_indices, self.user_tag_counts, user_row
            )
            w = float(mix_weight)
            mix = w * item / max(float(item.sum()), 1.0) + (1.0 - w) * user / max(float(user.sum()), 1.0)
            return mix + 1e-6 * self._global_tiebreak
        raise ValueError(f"unknown popularity kind {kind!r}")

    def _owner_counts(self, indptr, indices, counts, row: int) -> np.ndarray:
        out = np.zeros(len(self.tags_ids), dtype=np.float32)
        lo, hi = indptr[row], indptr[row + 1]
        out[indices[lo:hi]] = counts[lo:hi]
        return out

    # ------------------------------------------------------------------ RPC
    def tags(
        self, user_row: int, item_row: int, n: int, *, exclude_own: bool = False
    ) -> tuple[np.ndarray, np.ndarray, str]:
        """The ``n`` best tags for a post; -1 for an unknown user or item.

        Returns ``(tag_rows, scores, fallback)`` best first, fallback one of
        ``FALLBACKS``. ``exclude_own`` leaves out the tags this user already
        put on this item in training (only a known user and item have any).
        """
        exclude = None
        if user_row >= 0 and item_row >= 0:
            scores = self.scores(user_row, item_row)
            fallback = "none"
            if exclude_own:
                exclude = self.own_tags(user_row, item_row)
        elif item_row >= 0:
            scores, fallback = self.popular_scores("item", item_row=item_row), "popular_item"
        elif user_row >= 0:
            scores, fallback = self.popular_scores("user", user_row=user_row), "popular_user"
        else:
            scores, fallback = self.popular_scores("global"), "popular_global"
        rows, values = top_k(scores, n, exclude)
        return rows, values, fallback

    def tag_names(self, rows) -> list[str] | None:
        """Display names of tag rows, or None when the data had none."""
        if self._names is None:
            return None
        return [self._names[r] for r in rows]

    def smoke(self) -> None:
        n = min(10, len(self.tags_ids))
        rows, scores, fallback = self.tags(0, 0, n)
        if fallback != "none" or rows.size != n or not np.all(np.isfinite(scores)):
            raise ArtifactError(f"{self.artifact.describe()}: smoke Tags query failed")
        for u, i in ((-1, 0), (0, -1), (-1, -1)):
            rows, scores, _ = self.tags(u, i, n)
            if rows.size != n:
                raise ArtifactError(f"{self.artifact.describe()}: smoke fallback Tags query failed")
        self.cache.clear()
