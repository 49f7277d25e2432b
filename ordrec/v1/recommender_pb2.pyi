from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTITY_UNSPECIFIED: _ClassVar[Entity]
    ENTITY_ITEM: _ClassVar[Entity]
    ENTITY_USER: _ClassVar[Entity]
    ENTITY_ASPECT: _ClassVar[Entity]

class Fallback(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FALLBACK_NONE: _ClassVar[Fallback]
    FALLBACK_POPULAR_GLOBAL: _ClassVar[Fallback]
    FALLBACK_POPULAR_ITEM: _ClassVar[Fallback]
    FALLBACK_POPULAR_USER: _ClassVar[Fallback]
    FALLBACK_TRENDING: _ClassVar[Fallback]
ENTITY_UNSPECIFIED: Entity
ENTITY_ITEM: Entity
ENTITY_USER: Entity
ENTITY_ASPECT: Entity
FALLBACK_NONE: Fallback
FALLBACK_POPULAR_GLOBAL: Fallback
FALLBACK_POPULAR_ITEM: Fallback
FALLBACK_POPULAR_USER: Fallback
FALLBACK_TRENDING: Fallback

class ScoredId(_message.Message):
    __slots__ = ("id", "score", "rating_distribution", "label", "explanations", "fresh", "fallback")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RATING_DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    EXPLANATIONS_FIELD_NUMBER: _ClassVar[int]
    FRESH_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    id: str
    score: float
    rating_distribution: _containers.RepeatedScalarFieldContainer[float]
    label: str
    explanations: _containers.RepeatedCompositeFieldContainer[Explanation]
    fresh: bool
    fallback: Fallback
    def __init__(self, id: _Optional[str] = ..., score: _Optional[float] = ..., rating_distribution: _Optional[_Iterable[float]] = ..., label: _Optional[str] = ..., explanations: _Optional[_Iterable[_Union[Explanation, _Mapping]]] = ..., fresh: _Optional[bool] = ..., fallback: _Optional[_Union[Fallback, str]] = ...) -> None: ...

class Explanation(_message.Message):
    __slots__ = ("id", "share", "similarity", "rating")
    ID_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    RATING_FIELD_NUMBER: _ClassVar[int]
    id: str
    share: float
    similarity: float
    rating: float
    def __init__(self, id: _Optional[str] = ..., share: _Optional[float] = ..., similarity: _Optional[float] = ..., rating: _Optional[float] = ...) -> None: ...

class AttributeCap(_message.Message):
    __slots__ = ("attribute", "max")
    ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    attribute: str
    max: int
    def __init__(self, attribute: _Optional[str] = ..., max: _Optional[int] = ...) -> None: ...

class RecommendRequest(_message.Message):
    __slots__ = ("model", "user_ids", "n", "exclude_seen", "candidate_item_ids", "with_distribution", "exclude_item_ids", "filter", "explain", "diversity", "max_per_attribute")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USER_IDS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_SEEN_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    WITH_DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    DIVERSITY_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    model: str
    user_ids: _containers.RepeatedScalarFieldContainer[str]
    n: int
    exclude_seen: bool
    candidate_item_ids: _containers.RepeatedScalarFieldContainer[str]
    with_distribution: bool
    exclude_item_ids: _containers.RepeatedScalarFieldContainer[str]
    filter: str
    explain: int
    diversity: float
    max_per_attribute: AttributeCap
    def __init__(self, model: _Optional[str] = ..., user_ids: _Optional[_Iterable[str]] = ..., n: _Optional[int] = ..., exclude_seen: _Optional[bool] = ..., candidate_item_ids: _Optional[_Iterable[str]] = ..., with_distribution: _Optional[bool] = ..., exclude_item_ids: _Optional[_Iterable[str]] = ..., filter: _Optional[str] = ..., explain: _Optional[int] = ..., diversity: _Optional[float] = ..., max_per_attribute: _Optional[_Union[AttributeCap, _Mapping]] = ...) -> None: ...

class UserRecommendations(_message.Message):
    __slots__ = ("user_id", "items", "fallback", "folded_in", "model_version")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    FOLDED_IN_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    items: _containers.RepeatedCompositeFieldContainer[ScoredId]
    fallback: Fallback
    folded_in: bool
    model_version: str
    def __init__(self, user_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ScoredId, _Mapping]]] = ..., fallback: _Optional[_Union[Fallback, str]] = ..., folded_in: _Optional[bool] = ..., model_version: _Optional[str] = ...) -> None: ...

class RecommendResponse(_message.Message):
    __slots__ = ("results", "model", "model_version", "levels", "seen_filter_degraded", "rules_stale")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    SEEN_FILTER_DEGRADED_FIELD_NUMBER: _ClassVar[int]
    RULES_STALE_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[UserRecommendations]
    model: str
    model_version: str
    levels: _containers.RepeatedScalarFieldContainer[float]
    seen_filter_degraded: bool
    rules_stale: bool
    def __init__(self, results: _Optional[_Iterable[_Union[UserRecommendations, _Mapping]]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., levels: _Optional[_Iterable[float]] = ..., seen_filter_degraded: _Optional[bool] = ..., rules_stale: _Optional[bool] = ...) -> None: ...

class TagsRequest(_message.Message):
    __slots__ = ("model", "user_id", "item_id", "n", "exclude_own_tags")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_OWN_TAGS_FIELD_NUMBER: _ClassVar[int]
    model: str
    user_id: str
    item_id: str
    n: int
    exclude_own_tags: bool
    def __init__(self, model: _Optional[str] = ..., user_id: _Optional[str] = ..., item_id: _Optional[str] = ..., n: _Optional[int] = ..., exclude_own_tags: _Optional[bool] = ...) -> None: ...

class TagsResponse(_message.Message):
    __slots__ = ("tags", "fallback", "model", "model_version")
    TAGS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedCompositeFieldContainer[ScoredId]
    fallback: Fallback
    model: str
    model_version: str
    def __init__(self, tags: _Optional[_Iterable[_Union[ScoredId, _Mapping]]] = ..., fallback: _Optional[_Union[Fallback, str]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ...) -> None: ...

class NeighborsRequest(_message.Message):
    __slots__ = ("model", "space", "id", "from_entity", "to_entity", "k")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ENTITY_FIELD_NUMBER: _ClassVar[int]
    TO_ENTITY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    model: str
    space: str
    id: str
    from_entity: Entity
    to_entity: Entity
    k: int
    def __init__(self, model: _Optional[str] = ..., space: _Optional[str] = ..., id: _Optional[str] = ..., from_entity: _Optional[_Union[Entity, str]] = ..., to_entity: _Optional[_Union[Entity, str]] = ..., k: _Optional[int] = ...) -> None: ...

class NeighborsResponse(_message.Message):
    __slots__ = ("neighbors", "model", "model_version", "rules_stale")
    NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RULES_STALE_FIELD_NUMBER: _ClassVar[int]
    neighbors: _containers.RepeatedCompositeFieldContainer[ScoredId]
    model: str
    model_version: str
    rules_stale: bool
    def __init__(self, neighbors: _Optional[_Iterable[_Union[ScoredId, _Mapping]]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., rules_stale: _Optional[bool] = ...) -> None: ...

class CoordinatesRequest(_message.Message):
    __slots__ = ("model", "space", "entity", "ids", "page_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SPACE_FIELD_NUMBER: _ClassVar[int]
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: str
    space: str
    entity: Entity
    ids: _containers.RepeatedScalarFieldContainer[str]
    page_size: int
    def __init__(self, model: _Optional[str] = ..., space: _Optional[str] = ..., entity: _Optional[_Union[Entity, str]] = ..., ids: _Optional[_Iterable[str]] = ..., page_size: _Optional[int] = ...) -> None: ...

class Point(_message.Message):
    __slots__ = ("id", "entity", "coords")
    ID_FIELD_NUMBER: _ClassVar[int]
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    COORDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    entity: Entity
    coords: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, id: _Optional[str] = ..., entity: _Optional[_Union[Entity, str]] = ..., coords: _Optional[_Iterable[float]] = ...) -> None: ...

class CoordinatesResponse(_message.Message):
    __slots__ = ("points", "dim", "model", "model_version")
    POINTS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[Point]
    dim: int
    model: str
    model_version: str
    def __init__(self, points: _Optional[_Iterable[_Union[Point, _Mapping]]] = ..., dim: _Optional[int] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ...) -> None: ...

class PlaceRequest(_message.Message):
    __slots__ = ("model", "ranked_neighbor_ids", "k")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RANKED_NEIGHBOR_IDS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    model: str
    ranked_neighbor_ids: _containers.RepeatedScalarFieldContainer[str]
    k: int
    def __init__(self, model: _Optional[str] = ..., ranked_neighbor_ids: _Optional[_Iterable[str]] = ..., k: _Optional[int] = ...) -> None: ...

class PlaceResponse(_message.Message):
    __slots__ = ("coords", "neighbors", "model", "model_version")
    COORDS_FIELD_NUMBER: _ClassVar[int]
    NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    coords: _containers.RepeatedScalarFieldContainer[float]
    neighbors: _containers.RepeatedCompositeFieldContainer[ScoredId]
    model: str
    model_version: str
    def __init__(self, coords: _Optional[_Iterable[float]] = ..., neighbors: _Optional[_Iterable[_Union[ScoredId, _Mapping]]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ...) -> None: ...

class Interaction(_message.Message):
    __slots__ = ("item_id", "value", "timestamp")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    value: float
    timestamp: float
    def __init__(self, item_id: _Optional[str] = ..., value: _Optional[float] = ..., timestamp: _Optional[float] = ...) -> None: ...

class RecordInteractionsRequest(_message.Message):
    __slots__ = ("user_id", "item_ids", "interactions", "model")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    INTERACTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    interactions: _containers.RepeatedCompositeFieldContainer[Interaction]
    model: str
    def __init__(self, user_id: _Optional[str] = ..., item_ids: _Optional[_Iterable[str]] = ..., interactions: _Optional[_Iterable[_Union[Interaction, _Mapping]]] = ..., model: _Optional[str] = ...) -> None: ...

class RecordInteractionsResponse(_message.Message):
    __slots__ = ("recorded", "forgotten")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    forgotten: bool
    def __init__(self, recorded: _Optional[int] = ..., forgotten: _Optional[bool] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "kind", "version", "created_at", "loaded_at", "reason", "rpcs", "sizes", "metrics", "spaces", "index", "candidate_version", "candidate_share")
    class SizesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RPCS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SPACES_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_SHARE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    version: str
    created_at: str
    loaded_at: float
    reason: str
    rpcs: _containers.RepeatedScalarFieldContainer[str]
    sizes: _containers.ScalarMap[str, int]
    metrics: _containers.ScalarMap[str, float]
    spaces: _containers.RepeatedScalarFieldContainer[str]
    index: str
    candidate_version: str
    candidate_share: float
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., version: _Optional[str] = ..., created_at: _Optional[str] = ..., loaded_at: _Optional[float] = ..., reason: _Optional[str] = ..., rpcs: _Optional[_Iterable[str]] = ..., sizes: _Optional[_Mapping[str, int]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., spaces: _Optional[_Iterable[str]] = ..., index: _Optional[str] = ..., candidate_version: _Optional[str] = ..., candidate_share: _Optional[float] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class HideItemsRequest(_message.Message):
    __slots__ = ("model", "item_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., item_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HideItemsResponse(_message.Message):
    __slots__ = ("changed", "unknown", "total", "model")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    changed: int
    unknown: int
    total: int
    model: str
    def __init__(self, changed: _Optional[int] = ..., unknown: _Optional[int] = ..., total: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class ListHiddenRequest(_message.Message):
    __slots__ = ("model", "after_item_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    AFTER_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    model: str
    after_item_id: str
    def __init__(self, model: _Optional[str] = ..., after_item_id: _Optional[str] = ...) -> None: ...

class HiddenItems(_message.Message):
    __slots__ = ("model", "item_ids", "count")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    model: str
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    count: int
    def __init__(self, model: _Optional[str] = ..., item_ids: _Optional[_Iterable[str]] = ..., count: _Optional[int] = ...) -> None: ...

class ListHiddenResponse(_message.Message):
    __slots__ = ("scopes", "rules_stale")
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    RULES_STALE_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedCompositeFieldContainer[HiddenItems]
    rules_stale: bool
    def __init__(self, scopes: _Optional[_Iterable[_Union[HiddenItems, _Mapping]]] = ..., rules_stale: _Optional[bool] = ...) -> None: ...

class SimilarItemsRequest(_message.Message):
    __slots__ = ("model", "item_ids", "n", "exclude_item_ids", "filter", "diversity", "max_per_attribute")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    DIVERSITY_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    model: str
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    n: int
    exclude_item_ids: _containers.RepeatedScalarFieldContainer[str]
    filter: str
    diversity: float
    max_per_attribute: AttributeCap
    def __init__(self, model: _Optional[str] = ..., item_ids: _Optional[_Iterable[str]] = ..., n: _Optional[int] = ..., exclude_item_ids: _Optional[_Iterable[str]] = ..., filter: _Optional[str] = ..., diversity: _Optional[float] = ..., max_per_attribute: _Optional[_Union[AttributeCap, _Mapping]] = ...) -> None: ...

class SimilarItemsResponse(_message.Message):
    __slots__ = ("items", "model", "model_version", "rules_stale", "unknown_item_ids")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RULES_STALE_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoredId]
    model: str
    model_version: str
    rules_stale: bool
    unknown_item_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoredId, _Mapping]]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., rules_stale: _Optional[bool] = ..., unknown_item_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ForgetUserRequest(_message.Message):
    __slots__ = ("user_id", "reason")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    reason: str
    def __init__(self, user_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ForgetUserResponse(_message.Message):
    __slots__ = ("user_digest", "already_forgotten", "seen_items", "ratings", "served_keys", "stream_entries", "checkpoint_events", "versions_removed", "versions_pending", "redis_rewrite", "versions_redacted")
    USER_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ALREADY_FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    SEEN_ITEMS_FIELD_NUMBER: _ClassVar[int]
    RATINGS_FIELD_NUMBER: _ClassVar[int]
    SERVED_KEYS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVENTS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_PENDING_FIELD_NUMBER: _ClassVar[int]
    REDIS_REWRITE_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_REDACTED_FIELD_NUMBER: _ClassVar[int]
    user_digest: str
    already_forgotten: bool
    seen_items: int
    ratings: int
    served_keys: int
    stream_entries: int
    checkpoint_events: int
    versions_removed: _containers.RepeatedScalarFieldContainer[str]
    versions_pending: _containers.RepeatedScalarFieldContainer[str]
    redis_rewrite: str
    versions_redacted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, user_digest: _Optional[str] = ..., already_forgotten: _Optional[bool] = ..., seen_items: _Optional[int] = ..., ratings: _Optional[int] = ..., served_keys: _Optional[int] = ..., stream_entries: _Optional[int] = ..., checkpoint_events: _Optional[int] = ..., versions_removed: _Optional[_Iterable[str]] = ..., versions_pending: _Optional[_Iterable[str]] = ..., redis_rewrite: _Optional[str] = ..., versions_redacted: _Optional[_Iterable[str]] = ...) -> None: ...
