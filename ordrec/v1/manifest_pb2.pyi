from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ArrayFile(_message.Message):
    __slots__ = ("path", "sha256", "shape", "dtype")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    path: str
    sha256: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, path: _Optional[str] = ..., sha256: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class IdFile(_message.Message):
    __slots__ = ("space", "path", "sha256", "count")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    space: str
    path: str
    sha256: str
    count: int
    def __init__(self, space: _Optional[str] = ..., path: _Optional[str] = ..., sha256: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class ViewFile(_message.Message):
    __slots__ = ("name", "path", "sha256", "script_hashes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_HASHES_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    sha256: str
    script_hashes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., sha256: _Optional[str] = ..., script_hashes: _Optional[_Iterable[str]] = ...) -> None: ...

class IndexFile(_message.Message):
    __slots__ = ("name", "path", "sha256", "library", "params", "size_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LIBRARY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    sha256: str
    library: str
    params: _struct_pb2.Struct
    size_bytes: int
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., sha256: _Optional[str] = ..., library: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("format", "name", "kind", "version", "created_at", "code_version", "hyperparameters", "data_fingerprint", "metrics", "arrays", "ids", "attributes", "views", "indexes")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CODE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DATA_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ARRAYS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    format: int
    name: str
    kind: str
    version: str
    created_at: str
    code_version: str
    hyperparameters: _struct_pb2.Struct
    data_fingerprint: str
    metrics: _containers.ScalarMap[str, float]
    arrays: _containers.RepeatedCompositeFieldContainer[ArrayFile]
    ids: _containers.RepeatedCompositeFieldContainer[IdFile]
    attributes: _struct_pb2.Struct
    views: _containers.RepeatedCompositeFieldContainer[ViewFile]
    indexes: _containers.RepeatedCompositeFieldContainer[IndexFile]
    def __init__(self, format: _Optional[int] = ..., name: _Optional[str] = ..., kind: _Optional[str] = ..., version: _Optional[str] = ..., created_at: _Optional[str] = ..., code_version: _Optional[str] = ..., hyperparameters: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., data_fingerprint: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., arrays: _Optional[_Iterable[_Union[ArrayFile, _Mapping]]] = ..., ids: _Optional[_Iterable[_Union[IdFile, _Mapping]]] = ..., attributes: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., views: _Optional[_Iterable[_Union[ViewFile, _Mapping]]] = ..., indexes: _Optional[_Iterable[_Union[IndexFile, _Mapping]]] = ...) -> None: ...
