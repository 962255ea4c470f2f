from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CHECKPOINT_STATE_DELETING: CheckpointState
CHECKPOINT_STATE_READY: CheckpointState
CHECKPOINT_STATE_UNSPECIFIED: CheckpointState
CHECKPOINT_TIER_DISK: CheckpointTier
CHECKPOINT_TIER_MEMORY: CheckpointTier
CHECKPOINT_TIER_UNSPECIFIED: CheckpointTier
DESCRIPTOR: _descriptor.FileDescriptor
NETWORK_MODE_EGRESS: NetworkMode
NETWORK_MODE_NONE: NetworkMode
NETWORK_MODE_UNSPECIFIED: NetworkMode
NETWORK_PROTOCOL_TCP: NetworkProtocol
NETWORK_PROTOCOL_UDP: NetworkProtocol
NETWORK_PROTOCOL_UNSPECIFIED: NetworkProtocol
RECORDING_EXPORT_FORMAT_FRAMES: RecordingExportFormat
RECORDING_EXPORT_FORMAT_MP4: RecordingExportFormat
RECORDING_EXPORT_FORMAT_UNSPECIFIED: RecordingExportFormat
RECORDING_FILE_FRAMES: RecordingFile
RECORDING_FILE_MP4: RecordingFile
RECORDING_FILE_SCREENCAST: RecordingFile
RECORDING_FILE_TRAJECTORY: RecordingFile
RECORDING_FILE_UNSPECIFIED: RecordingFile
RECORDING_STATE_RECORDING: RecordingState
RECORDING_STATE_STOPPED: RecordingState
RECORDING_STATE_UNSPECIFIED: RecordingState
RECORDING_STOP_REASON_CAP_REACHED: RecordingStopReason
RECORDING_STOP_REASON_CONTROLD_STOPPED: RecordingStopReason
RECORDING_STOP_REASON_FAILED: RecordingStopReason
RECORDING_STOP_REASON_REQUESTED: RecordingStopReason
RECORDING_STOP_REASON_SANDBOX_GONE: RecordingStopReason
RECORDING_STOP_REASON_UNSPECIFIED: RecordingStopReason
RESTORE_MODE_AUTO: RestoreMode
RESTORE_MODE_EAGER: RestoreMode
RESTORE_MODE_LAZY: RestoreMode
RESTORE_MODE_UNSPECIFIED: RestoreMode
SANDBOX_EVENT_TYPE_CREATED: SandboxEventType
SANDBOX_EVENT_TYPE_DELETED: SandboxEventType
SANDBOX_EVENT_TYPE_EXISTING: SandboxEventType
SANDBOX_EVENT_TYPE_LIMIT: SandboxEventType
SANDBOX_EVENT_TYPE_PHASE: SandboxEventType
SANDBOX_EVENT_TYPE_STATE: SandboxEventType
SANDBOX_EVENT_TYPE_UNSPECIFIED: SandboxEventType
SANDBOX_LIMIT_DISK: SandboxLimit
SANDBOX_LIMIT_MEMORY: SandboxLimit
SANDBOX_LIMIT_PIDS: SandboxLimit
SANDBOX_LIMIT_UNSPECIFIED: SandboxLimit
SANDBOX_STATE_BOOTING: SandboxState
SANDBOX_STATE_CREATING: SandboxState
SANDBOX_STATE_DELETED: SandboxState
SANDBOX_STATE_FAILED: SandboxState
SANDBOX_STATE_READY: SandboxState
SANDBOX_STATE_STOPPED: SandboxState
SANDBOX_STATE_STOPPING: SandboxState
SANDBOX_STATE_SUSPENDED: SandboxState
SANDBOX_STATE_UNSPECIFIED: SandboxState
VERIFY_LEVEL_FILESYSTEM: VerifyLevel
VERIFY_LEVEL_MARKER: VerifyLevel
VERIFY_LEVEL_MEMORY: VerifyLevel
VERIFY_LEVEL_NETWORK: VerifyLevel
VERIFY_LEVEL_NONE: VerifyLevel
VERIFY_LEVEL_PIXELS: VerifyLevel
VERIFY_LEVEL_UNSPECIFIED: VerifyLevel

class BootPhase(_message.Message):
    __slots__ = ["at", "name"]
    AT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    at: _duration_pb2.Duration
    name: str
    def __init__(self, name: _Optional[str] = ..., at: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ["child_ids", "created_at", "host", "id", "image", "labels", "layer_bytes", "live_forks", "memory_bytes", "name", "network", "parent_checkpoint_id", "resources", "run_as_root", "screen", "source_sandbox_id", "state", "tier", "timing", "verify_levels"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CHILD_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LAYER_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIVE_FORKS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    PARENT_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_ROOT_FIELD_NUMBER: _ClassVar[int]
    SCREEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    VERIFY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    child_ids: _containers.RepeatedScalarFieldContainer[str]
    created_at: _timestamp_pb2.Timestamp
    host: str
    id: str
    image: str
    labels: _containers.ScalarMap[str, str]
    layer_bytes: int
    live_forks: int
    memory_bytes: int
    name: str
    network: Network
    parent_checkpoint_id: str
    resources: Resources
    run_as_root: bool
    screen: Screen
    source_sandbox_id: str
    state: CheckpointState
    tier: CheckpointTier
    timing: CheckpointTiming
    verify_levels: _containers.RepeatedScalarFieldContainer[VerifyLevel]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., tier: _Optional[_Union[CheckpointTier, str]] = ..., state: _Optional[_Union[CheckpointState, str]] = ..., source_sandbox_id: _Optional[str] = ..., parent_checkpoint_id: _Optional[str] = ..., image: _Optional[str] = ..., screen: _Optional[_Union[Screen, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., memory_bytes: _Optional[int] = ..., layer_bytes: _Optional[int] = ..., timing: _Optional[_Union[CheckpointTiming, _Mapping]] = ..., child_ids: _Optional[_Iterable[str]] = ..., verify_levels: _Optional[_Iterable[_Union[VerifyLevel, str]]] = ..., live_forks: _Optional[int] = ..., network: _Optional[_Union[Network, _Mapping]] = ..., run_as_root: bool = ..., host: _Optional[str] = ...) -> None: ...

class CheckpointTiming(_message.Message):
    __slots__ = ["dump", "frozen", "layer", "total"]
    DUMP_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    dump: _duration_pb2.Duration
    frozen: _duration_pb2.Duration
    layer: _duration_pb2.Duration
    total: _duration_pb2.Duration
    def __init__(self, frozen: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., dump: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., layer: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., total: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ClaimPoolRequest(_message.Message):
    __slots__ = ["labels", "network_policy", "pool_id", "request_id", "ttl"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    network_policy: NetworkPolicy
    pool_id: str
    request_id: str
    ttl: _duration_pb2.Duration
    def __init__(self, pool_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., network_policy: _Optional[_Union[NetworkPolicy, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClaimPoolResponse(_message.Message):
    __slots__ = ["endpoint", "hit", "sandbox", "took"]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HIT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    TOOK_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    hit: bool
    sandbox: Sandbox
    took: _duration_pb2.Duration
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ..., endpoint: _Optional[_Union[Endpoint, _Mapping]] = ..., hit: bool = ..., took: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CreateCheckpointRequest(_message.Message):
    __slots__ = ["labels", "name", "request_id", "sandbox_id", "stop", "tier"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    name: str
    request_id: str
    sandbox_id: str
    stop: bool
    tier: CheckpointTier
    def __init__(self, sandbox_id: _Optional[str] = ..., tier: _Optional[_Union[CheckpointTier, str]] = ..., name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., stop: bool = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateCheckpointResponse(_message.Message):
    __slots__ = ["checkpoint"]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class CreatePoolRequest(_message.Message):
    __slots__ = ["checkpoint_id", "image", "labels", "name", "network", "resources", "screen", "size"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    SCREEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    image: str
    labels: _containers.ScalarMap[str, str]
    name: str
    network: Network
    resources: Resources
    screen: Screen
    size: int
    def __init__(self, name: _Optional[str] = ..., image: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., size: _Optional[int] = ..., screen: _Optional[_Union[Screen, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., network: _Optional[_Union[Network, _Mapping]] = ...) -> None: ...

class CreatePoolResponse(_message.Message):
    __slots__ = ["pool"]
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class CreateRecordingTicketRequest(_message.Message):
    __slots__ = ["file", "id", "ttl"]
    FILE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    file: RecordingFile
    id: str
    ttl: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., file: _Optional[_Union[RecordingFile, str]] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CreateRecordingTicketResponse(_message.Message):
    __slots__ = ["expires_at", "name", "ticket", "url"]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    expires_at: _timestamp_pb2.Timestamp
    name: str
    ticket: str
    url: str
    def __init__(self, url: _Optional[str] = ..., ticket: _Optional[str] = ..., expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., name: _Optional[str] = ...) -> None: ...

class CreateSandboxRequest(_message.Message):
    __slots__ = ["env", "image", "labels", "network", "request_id", "resources", "run_as_root", "screen", "ttl", "wait_ready"]
    class EnvEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_ROOT_FIELD_NUMBER: _ClassVar[int]
    SCREEN_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    WAIT_READY_FIELD_NUMBER: _ClassVar[int]
    env: _containers.ScalarMap[str, str]
    image: str
    labels: _containers.ScalarMap[str, str]
    network: Network
    request_id: str
    resources: Resources
    run_as_root: bool
    screen: Screen
    ttl: _duration_pb2.Duration
    wait_ready: bool
    def __init__(self, image: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., screen: _Optional[_Union[Screen, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., wait_ready: bool = ..., network: _Optional[_Union[Network, _Mapping]] = ..., run_as_root: bool = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateSandboxResponse(_message.Message):
    __slots__ = ["endpoint", "sandbox"]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ..., endpoint: _Optional[_Union[Endpoint, _Mapping]] = ...) -> None: ...

class CreateViewTicketRequest(_message.Message):
    __slots__ = ["control", "sandbox_id", "ttl"]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    control: bool
    sandbox_id: str
    ttl: _duration_pb2.Duration
    def __init__(self, sandbox_id: _Optional[str] = ..., control: bool = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CreateViewTicketResponse(_message.Message):
    __slots__ = ["expires_at", "ticket", "url"]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    expires_at: _timestamp_pb2.Timestamp
    ticket: str
    url: str
    def __init__(self, url: _Optional[str] = ..., ticket: _Optional[str] = ..., expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DeleteCheckpointRequest(_message.Message):
    __slots__ = ["cascade", "id"]
    CASCADE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    cascade: bool
    id: str
    def __init__(self, id: _Optional[str] = ..., cascade: bool = ...) -> None: ...

class DeleteCheckpointResponse(_message.Message):
    __slots__ = ["deleted_ids"]
    DELETED_IDS_FIELD_NUMBER: _ClassVar[int]
    deleted_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deleted_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeletePoolRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeletePoolResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class DeleteRecordingRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteRecordingResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class DeleteSandboxRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteSandboxResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ["token", "unix_path", "unix_pid_start", "url"]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNIX_PATH_FIELD_NUMBER: _ClassVar[int]
    UNIX_PID_START_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    token: str
    unix_path: str
    unix_pid_start: int
    url: str
    def __init__(self, url: _Optional[str] = ..., token: _Optional[str] = ..., unix_path: _Optional[str] = ..., unix_pid_start: _Optional[int] = ...) -> None: ...

class ExportCheckpointRequest(_message.Message):
    __slots__ = ["id", "push", "reference"]
    ID_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    push: bool
    reference: str
    def __init__(self, id: _Optional[str] = ..., reference: _Optional[str] = ..., push: bool = ...) -> None: ...

class ExportCheckpointResponse(_message.Message):
    __slots__ = ["digest", "pushed_bytes", "reference", "size_bytes"]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    PUSHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    pushed_bytes: int
    reference: str
    size_bytes: int
    def __init__(self, reference: _Optional[str] = ..., digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., pushed_bytes: _Optional[int] = ...) -> None: ...

class ExportRecordingRequest(_message.Message):
    __slots__ = ["format", "fps", "id"]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    format: RecordingExportFormat
    fps: int
    id: str
    def __init__(self, id: _Optional[str] = ..., format: _Optional[_Union[RecordingExportFormat, str]] = ..., fps: _Optional[int] = ...) -> None: ...

class ExportRecordingResponse(_message.Message):
    __slots__ = ["bytes", "duration", "frames", "path"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    duration: _duration_pb2.Duration
    frames: int
    path: str
    def __init__(self, path: _Optional[str] = ..., bytes: _Optional[int] = ..., frames: _Optional[int] = ..., duration: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ExposePortRequest(_message.Message):
    __slots__ = ["port", "sandbox_id"]
    PORT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    port: int
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class ExposePortResponse(_message.Message):
    __slots__ = ["token", "url"]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    token: str
    url: str
    def __init__(self, url: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class ExtendSandboxRequest(_message.Message):
    __slots__ = ["id", "ttl"]
    ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    id: str
    ttl: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ExtendSandboxResponse(_message.Message):
    __slots__ = ["sandbox"]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class ForkCheckpointRequest(_message.Message):
    __slots__ = ["checkpoint_id", "checkpoint_reference", "count", "labels", "network_policy", "record", "request_id", "resources", "restore_mode", "ttl", "verify"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RESTORE_MODE_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    checkpoint_reference: str
    count: int
    labels: _containers.ScalarMap[str, str]
    network_policy: NetworkPolicy
    record: bool
    request_id: str
    resources: Resources
    restore_mode: RestoreMode
    ttl: _duration_pb2.Duration
    verify: _containers.RepeatedScalarFieldContainer[VerifyLevel]
    def __init__(self, checkpoint_id: _Optional[str] = ..., count: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., verify: _Optional[_Iterable[_Union[VerifyLevel, str]]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., network_policy: _Optional[_Union[NetworkPolicy, _Mapping]] = ..., request_id: _Optional[str] = ..., checkpoint_reference: _Optional[str] = ..., record: bool = ..., restore_mode: _Optional[_Union[RestoreMode, str]] = ...) -> None: ...

class ForkCheckpointResponse(_message.Message):
    __slots__ = ["checkpoint_id", "replicas"]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    replicas: _containers.RepeatedCompositeFieldContainer[ForkReplica]
    def __init__(self, replicas: _Optional[_Iterable[_Union[ForkReplica, _Mapping]]] = ..., checkpoint_id: _Optional[str] = ...) -> None: ...

class ForkReplica(_message.Message):
    __slots__ = ["endpoint", "error_code", "error_message", "lazy_restore", "recording_id", "restore_mode", "sandbox", "took", "verification"]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAZY_RESTORE_FIELD_NUMBER: _ClassVar[int]
    RECORDING_ID_FIELD_NUMBER: _ClassVar[int]
    RESTORE_MODE_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    TOOK_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    error_code: int
    error_message: str
    lazy_restore: LazyRestoreStats
    recording_id: str
    restore_mode: RestoreMode
    sandbox: Sandbox
    took: _duration_pb2.Duration
    verification: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ..., endpoint: _Optional[_Union[Endpoint, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., verification: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ..., took: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., recording_id: _Optional[str] = ..., restore_mode: _Optional[_Union[RestoreMode, str]] = ..., lazy_restore: _Optional[_Union[LazyRestoreStats, _Mapping]] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetCheckpointResponse(_message.Message):
    __slots__ = ["checkpoint"]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class GetHostStatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetHostStatusResponse(_message.Message):
    __slots__ = ["admitted_memory_bytes", "checkpoints", "default_memory_bytes", "host", "max_memory_bytes", "max_sandboxes", "memory_available_bytes", "memory_total_bytes", "pools", "sandboxes", "version"]
    ADMITTED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    MAX_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    admitted_memory_bytes: int
    checkpoints: int
    default_memory_bytes: int
    host: str
    max_memory_bytes: int
    max_sandboxes: int
    memory_available_bytes: int
    memory_total_bytes: int
    pools: _containers.RepeatedCompositeFieldContainer[PoolStatus]
    sandboxes: int
    version: str
    def __init__(self, host: _Optional[str] = ..., version: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., sandboxes: _Optional[int] = ..., max_sandboxes: _Optional[int] = ..., admitted_memory_bytes: _Optional[int] = ..., max_memory_bytes: _Optional[int] = ..., default_memory_bytes: _Optional[int] = ..., checkpoints: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[PoolStatus, _Mapping]]] = ...) -> None: ...

class GetPoolRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetPoolResponse(_message.Message):
    __slots__ = ["pool"]
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class GetRecordingRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetRecordingResponse(_message.Message):
    __slots__ = ["recording"]
    RECORDING_FIELD_NUMBER: _ClassVar[int]
    recording: Recording
    def __init__(self, recording: _Optional[_Union[Recording, _Mapping]] = ...) -> None: ...

class GetSandboxEndpointRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetSandboxEndpointResponse(_message.Message):
    __slots__ = ["endpoint"]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    def __init__(self, endpoint: _Optional[_Union[Endpoint, _Mapping]] = ...) -> None: ...

class GetSandboxRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetSandboxResponse(_message.Message):
    __slots__ = ["sandbox"]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class ImportCheckpointRequest(_message.Message):
    __slots__ = ["pull", "reference"]
    PULL_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    pull: bool
    reference: str
    def __init__(self, reference: _Optional[str] = ..., pull: bool = ...) -> None: ...

class ImportCheckpointResponse(_message.Message):
    __slots__ = ["checkpoint", "pulled_bytes"]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PULLED_BYTES_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    pulled_bytes: int
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., pulled_bytes: _Optional[int] = ...) -> None: ...

class LazyRestoreStats(_message.Message):
    __slots__ = ["fault_pages", "faults", "hot_pages", "lazy_pages"]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    FAULT_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOT_PAGES_FIELD_NUMBER: _ClassVar[int]
    LAZY_PAGES_FIELD_NUMBER: _ClassVar[int]
    fault_pages: int
    faults: int
    hot_pages: int
    lazy_pages: int
    def __init__(self, lazy_pages: _Optional[int] = ..., faults: _Optional[int] = ..., fault_pages: _Optional[int] = ..., hot_pages: _Optional[int] = ...) -> None: ...

class LimitReached(_message.Message):
    __slots__ = ["count", "first_at", "last_at", "limit", "message"]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_AT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    count: int
    first_at: _timestamp_pb2.Timestamp
    last_at: _timestamp_pb2.Timestamp
    limit: SandboxLimit
    message: str
    def __init__(self, limit: _Optional[_Union[SandboxLimit, str]] = ..., count: _Optional[int] = ..., first_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ["labels", "page_size", "page_token", "root_id"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROOT_ID_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    root_id: str
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., root_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ["checkpoints", "next_page_token"]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]
    next_page_token: str
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ["page_size", "page_token"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ["next_page_token", "pools"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    def __init__(self, pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListRecordingsRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "sandbox_id"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRecordingsResponse(_message.Message):
    __slots__ = ["next_page_token", "recordings"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RECORDINGS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    recordings: _containers.RepeatedCompositeFieldContainer[Recording]
    def __init__(self, recordings: _Optional[_Iterable[_Union[Recording, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListSandboxesRequest(_message.Message):
    __slots__ = ["labels", "page_size", "page_token", "states"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[SandboxState]
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., states: _Optional[_Iterable[_Union[SandboxState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSandboxesResponse(_message.Message):
    __slots__ = ["next_page_token", "sandboxes"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    sandboxes: _containers.RepeatedCompositeFieldContainer[Sandbox]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[Sandbox, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Network(_message.Message):
    __slots__ = ["mode", "policy"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    mode: NetworkMode
    policy: NetworkPolicy
    def __init__(self, mode: _Optional[_Union[NetworkMode, str]] = ..., policy: _Optional[_Union[NetworkPolicy, _Mapping]] = ...) -> None: ...

class NetworkPolicy(_message.Message):
    __slots__ = ["allow", "deny"]
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    DENY_FIELD_NUMBER: _ClassVar[int]
    allow: _containers.RepeatedCompositeFieldContainer[NetworkRule]
    deny: _containers.RepeatedCompositeFieldContainer[NetworkRule]
    def __init__(self, allow: _Optional[_Iterable[_Union[NetworkRule, _Mapping]]] = ..., deny: _Optional[_Iterable[_Union[NetworkRule, _Mapping]]] = ...) -> None: ...

class NetworkRule(_message.Message):
    __slots__ = ["cidr", "ports", "protocol"]
    CIDR_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    cidr: str
    ports: _containers.RepeatedCompositeFieldContainer[PortRange]
    protocol: NetworkProtocol
    def __init__(self, cidr: _Optional[str] = ..., protocol: _Optional[_Union[NetworkProtocol, str]] = ..., ports: _Optional[_Iterable[_Union[PortRange, _Mapping]]] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ["available", "checkpoint_id", "frozen", "hits", "host", "id", "image", "labels", "misses", "name", "network", "resources", "screen", "size"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    SCREEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    available: int
    checkpoint_id: str
    frozen: bool
    hits: int
    host: str
    id: str
    image: str
    labels: _containers.ScalarMap[str, str]
    misses: int
    name: str
    network: Network
    resources: Resources
    screen: Screen
    size: int
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., image: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., size: _Optional[int] = ..., available: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., screen: _Optional[_Union[Screen, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., frozen: bool = ..., network: _Optional[_Union[Network, _Mapping]] = ..., host: _Optional[str] = ...) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ["available", "id", "name", "size"]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    available: int
    id: str
    name: str
    size: int
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., size: _Optional[int] = ..., available: _Optional[int] = ...) -> None: ...

class PortRange(_message.Message):
    __slots__ = ["first", "last"]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class Recording(_message.Message):
    __slots__ = ["bytes", "dir", "frames", "frames_skipped", "height", "id", "max_bytes", "parent_checkpoint_id", "parent_recording_id", "requests", "sandbox_id", "started_at", "state", "stop_message", "stop_reason", "stopped_at", "width"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARENT_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RECORDING_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STOPPED_AT_FIELD_NUMBER: _ClassVar[int]
    STOP_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    dir: str
    frames: int
    frames_skipped: int
    height: int
    id: str
    max_bytes: int
    parent_checkpoint_id: str
    parent_recording_id: str
    requests: int
    sandbox_id: str
    started_at: _timestamp_pb2.Timestamp
    state: RecordingState
    stop_message: str
    stop_reason: RecordingStopReason
    stopped_at: _timestamp_pb2.Timestamp
    width: int
    def __init__(self, id: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., state: _Optional[_Union[RecordingState, str]] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., stopped_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., stop_reason: _Optional[_Union[RecordingStopReason, str]] = ..., stop_message: _Optional[str] = ..., bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., frames: _Optional[int] = ..., requests: _Optional[int] = ..., frames_skipped: _Optional[int] = ..., parent_recording_id: _Optional[str] = ..., parent_checkpoint_id: _Optional[str] = ..., dir: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ["cpu_millis", "cpu_weight", "disk_bytes", "log_bytes", "memory_bytes", "pids_max"]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    CPU_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_MAX_FIELD_NUMBER: _ClassVar[int]
    cpu_millis: int
    cpu_weight: int
    disk_bytes: int
    log_bytes: int
    memory_bytes: int
    pids_max: int
    def __init__(self, cpu_millis: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., cpu_weight: _Optional[int] = ..., pids_max: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., log_bytes: _Optional[int] = ...) -> None: ...

class ResumeSandboxRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ResumeSandboxResponse(_message.Message):
    __slots__ = ["sandbox"]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class Sandbox(_message.Message):
    __slots__ = ["boot", "checkpoint_id", "created_at", "expires_at", "generation", "host", "id", "image", "labels", "limits_reached", "network", "pool_id", "ready_at", "resources", "run_as_root", "screen", "state", "status_message"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BOOT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_REACHED_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    READY_AT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_ROOT_FIELD_NUMBER: _ClassVar[int]
    SCREEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    boot: _containers.RepeatedCompositeFieldContainer[BootPhase]
    checkpoint_id: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    generation: int
    host: str
    id: str
    image: str
    labels: _containers.ScalarMap[str, str]
    limits_reached: _containers.RepeatedCompositeFieldContainer[LimitReached]
    network: Network
    pool_id: str
    ready_at: _timestamp_pb2.Timestamp
    resources: Resources
    run_as_root: bool
    screen: Screen
    state: SandboxState
    status_message: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[SandboxState, str]] = ..., image: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., screen: _Optional[_Union[Screen, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., ready_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., checkpoint_id: _Optional[str] = ..., generation: _Optional[int] = ..., pool_id: _Optional[str] = ..., host: _Optional[str] = ..., boot: _Optional[_Iterable[_Union[BootPhase, _Mapping]]] = ..., status_message: _Optional[str] = ..., limits_reached: _Optional[_Iterable[_Union[LimitReached, _Mapping]]] = ..., network: _Optional[_Union[Network, _Mapping]] = ..., run_as_root: bool = ...) -> None: ...

class Screen(_message.Message):
    __slots__ = ["depth", "height", "width"]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    depth: int
    height: int
    width: int
    def __init__(self, width: _Optional[int] = ..., height: _Optional[int] = ..., depth: _Optional[int] = ...) -> None: ...

class StartRecordingRequest(_message.Message):
    __slots__ = ["max_bytes", "sandbox_id"]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    max_bytes: int
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class StartRecordingResponse(_message.Message):
    __slots__ = ["recording"]
    RECORDING_FIELD_NUMBER: _ClassVar[int]
    recording: Recording
    def __init__(self, recording: _Optional[_Union[Recording, _Mapping]] = ...) -> None: ...

class StopRecordingRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class StopRecordingResponse(_message.Message):
    __slots__ = ["recording"]
    RECORDING_FIELD_NUMBER: _ClassVar[int]
    recording: Recording
    def __init__(self, recording: _Optional[_Union[Recording, _Mapping]] = ...) -> None: ...

class SuspendSandboxRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class SuspendSandboxResponse(_message.Message):
    __slots__ = ["sandbox"]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class UnexposePortRequest(_message.Message):
    __slots__ = ["port", "sandbox_id"]
    PORT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    port: int
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class UnexposePortResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class UpdatePoolRequest(_message.Message):
    __slots__ = ["id", "size"]
    ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    id: str
    size: int
    def __init__(self, id: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class UpdatePoolResponse(_message.Message):
    __slots__ = ["pool"]
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class UpdateSandboxNetworkRequest(_message.Message):
    __slots__ = ["id", "policy"]
    ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    id: str
    policy: NetworkPolicy
    def __init__(self, id: _Optional[str] = ..., policy: _Optional[_Union[NetworkPolicy, _Mapping]] = ...) -> None: ...

class UpdateSandboxNetworkResponse(_message.Message):
    __slots__ = ["sandbox"]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ["detail", "level", "ok", "took"]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    TOOK_FIELD_NUMBER: _ClassVar[int]
    detail: str
    level: VerifyLevel
    ok: bool
    took: _duration_pb2.Duration
    def __init__(self, level: _Optional[_Union[VerifyLevel, str]] = ..., ok: bool = ..., detail: _Optional[str] = ..., took: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class VerifySandboxRequest(_message.Message):
    __slots__ = ["id", "levels"]
    ID_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    id: str
    levels: _containers.RepeatedScalarFieldContainer[VerifyLevel]
    def __init__(self, id: _Optional[str] = ..., levels: _Optional[_Iterable[_Union[VerifyLevel, str]]] = ...) -> None: ...

class VerifySandboxResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ...) -> None: ...

class WaitSandboxReadyRequest(_message.Message):
    __slots__ = ["id", "timeout"]
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    id: str
    timeout: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitSandboxReadyResponse(_message.Message):
    __slots__ = ["sandbox"]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class WatchSandboxesRequest(_message.Message):
    __slots__ = ["ids", "labels"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IDS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WatchSandboxesResponse(_message.Message):
    __slots__ = ["phase", "sandbox", "type"]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    phase: BootPhase
    sandbox: Sandbox
    type: SandboxEventType
    def __init__(self, type: _Optional[_Union[SandboxEventType, str]] = ..., sandbox: _Optional[_Union[Sandbox, _Mapping]] = ..., phase: _Optional[_Union[BootPhase, _Mapping]] = ...) -> None: ...

class SandboxState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class SandboxLimit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class SandboxEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class VerifyLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CheckpointTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CheckpointState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RestoreMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class NetworkMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class NetworkProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RecordingState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RecordingStopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RecordingExportFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RecordingFile(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
