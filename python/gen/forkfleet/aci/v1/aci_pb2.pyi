from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

A11Y_ACTION_KIND_DO: A11yActionKind
A11Y_ACTION_KIND_FOCUS: A11yActionKind
A11Y_ACTION_KIND_SCROLL_INTO_VIEW: A11yActionKind
A11Y_ACTION_KIND_SET_TEXT: A11yActionKind
A11Y_ACTION_KIND_SET_VALUE: A11yActionKind
A11Y_ACTION_KIND_UNSPECIFIED: A11yActionKind
A11Y_FIELD_ACTIONS: A11yField
A11Y_FIELD_BOUNDS: A11yField
A11Y_FIELD_DESCRIPTION: A11yField
A11Y_FIELD_STATES: A11yField
A11Y_FIELD_TEXT: A11yField
A11Y_FIELD_UNSPECIFIED: A11yField
A11Y_FIELD_VALUE: A11yField
A11Y_ROOT_DESKTOP: A11yRoot
A11Y_ROOT_FOCUSED_WINDOW: A11yRoot
A11Y_ROOT_POINT: A11yRoot
A11Y_ROOT_UNSPECIFIED: A11yRoot
A11Y_ROOT_WINDOW: A11yRoot
CURSOR_MODE_EVENTS: CursorMode
CURSOR_MODE_HIDDEN: CursorMode
CURSOR_MODE_OVERLAY: CursorMode
CURSOR_MODE_UNSPECIFIED: CursorMode
DESCRIPTOR: _descriptor.FileDescriptor
ERROR_CODE_ALREADY_EXISTS: ErrorCode
ERROR_CODE_CANCELED: ErrorCode
ERROR_CODE_FAILED_PRECONDITION: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_NOT_FOUND: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
ERROR_CODE_RESOURCE_EXHAUSTED: ErrorCode
ERROR_CODE_TIMEOUT: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_UNIMPLEMENTED: ErrorCode
ERROR_CODE_UNSPECIFIED: ErrorCode
IMAGE_FORMAT_JPEG: ImageFormat
IMAGE_FORMAT_NONE: ImageFormat
IMAGE_FORMAT_PNG: ImageFormat
IMAGE_FORMAT_UNSPECIFIED: ImageFormat
IMAGE_FORMAT_ZLIB_BGR: ImageFormat
IMAGE_FORMAT_ZLIB_RECORDS: ImageFormat
MOUSE_BUTTON_BACK: MouseButton
MOUSE_BUTTON_FORWARD: MouseButton
MOUSE_BUTTON_LEFT: MouseButton
MOUSE_BUTTON_MIDDLE: MouseButton
MOUSE_BUTTON_RIGHT: MouseButton
MOUSE_BUTTON_UNSPECIFIED: MouseButton
WINDOW_OP_ACTIVATE: WindowOp
WINDOW_OP_CLOSE: WindowOp
WINDOW_OP_FULLSCREEN: WindowOp
WINDOW_OP_MAXIMIZE: WindowOp
WINDOW_OP_MINIMIZE: WindowOp
WINDOW_OP_MOVE_RESIZE: WindowOp
WINDOW_OP_RESTORE: WindowOp
WINDOW_OP_UNSPECIFIED: WindowOp

class A11yActionRequest(_message.Message):
    __slots__ = ["action", "kind", "ref", "text", "timeout_ms", "value"]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    action: str
    kind: A11yActionKind
    ref: str
    text: str
    timeout_ms: int
    value: float
    def __init__(self, ref: _Optional[str] = ..., kind: _Optional[_Union[A11yActionKind, str]] = ..., action: _Optional[str] = ..., text: _Optional[str] = ..., value: _Optional[float] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class A11yActionResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class A11yApp(_message.Message):
    __slots__ = ["bus_name", "error", "name", "node", "pid", "timed_out"]
    BUS_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    bus_name: str
    error: str
    name: str
    node: int
    pid: int
    timed_out: bool
    def __init__(self, name: _Optional[str] = ..., pid: _Optional[int] = ..., bus_name: _Optional[str] = ..., timed_out: bool = ..., error: _Optional[str] = ..., node: _Optional[int] = ...) -> None: ...

class A11yNode(_message.Message):
    __slots__ = ["actions", "app", "bounds", "children", "children_truncated", "description", "id", "name", "ref", "role", "states", "text", "value", "window"]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedScalarFieldContainer[str]
    app: int
    bounds: Rect
    children: _containers.RepeatedScalarFieldContainer[int]
    children_truncated: bool
    description: str
    id: int
    name: str
    ref: str
    role: str
    states: int
    text: str
    value: float
    window: int
    def __init__(self, id: _Optional[int] = ..., role: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., states: _Optional[int] = ..., bounds: _Optional[_Union[Rect, _Mapping]] = ..., text: _Optional[str] = ..., value: _Optional[float] = ..., actions: _Optional[_Iterable[str]] = ..., children: _Optional[_Iterable[int]] = ..., app: _Optional[int] = ..., window: _Optional[int] = ..., ref: _Optional[str] = ..., children_truncated: bool = ...) -> None: ...

class A11yTreeRequest(_message.Message):
    __slots__ = ["app_timeout_ms", "fields", "if_none_match", "max_depth", "max_nodes", "point", "root", "showing_only", "timeout_ms", "window_id"]
    APP_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    IF_NONE_MATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    SHOWING_ONLY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_ID_FIELD_NUMBER: _ClassVar[int]
    app_timeout_ms: int
    fields: _containers.RepeatedScalarFieldContainer[A11yField]
    if_none_match: bytes
    max_depth: int
    max_nodes: int
    point: Point
    root: A11yRoot
    showing_only: bool
    timeout_ms: int
    window_id: int
    def __init__(self, root: _Optional[_Union[A11yRoot, str]] = ..., window_id: _Optional[int] = ..., point: _Optional[_Union[Point, _Mapping]] = ..., max_depth: _Optional[int] = ..., max_nodes: _Optional[int] = ..., showing_only: bool = ..., timeout_ms: _Optional[int] = ..., app_timeout_ms: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[A11yField, str]]] = ..., if_none_match: _Optional[bytes] = ...) -> None: ...

class A11yTreeResponse(_message.Message):
    __slots__ = ["apps", "bus", "duration_ns", "nodes", "not_modified", "partial", "tree_hash", "truncated"]
    APPS_FIELD_NUMBER: _ClassVar[int]
    BUS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    NOT_MODIFIED_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    TREE_HASH_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    apps: _containers.RepeatedCompositeFieldContainer[A11yApp]
    bus: bool
    duration_ns: int
    nodes: _containers.RepeatedCompositeFieldContainer[A11yNode]
    not_modified: bool
    partial: bool
    tree_hash: bytes
    truncated: bool
    def __init__(self, nodes: _Optional[_Iterable[_Union[A11yNode, _Mapping]]] = ..., apps: _Optional[_Iterable[_Union[A11yApp, _Mapping]]] = ..., partial: bool = ..., truncated: bool = ..., tree_hash: _Optional[bytes] = ..., not_modified: bool = ..., bus: bool = ..., duration_ns: _Optional[int] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ["button_down", "button_up", "click", "drag", "key_combo", "key_down", "key_press", "key_up", "move", "scroll", "type_text", "wait"]
    BUTTON_DOWN_FIELD_NUMBER: _ClassVar[int]
    BUTTON_UP_FIELD_NUMBER: _ClassVar[int]
    CLICK_FIELD_NUMBER: _ClassVar[int]
    DRAG_FIELD_NUMBER: _ClassVar[int]
    KEY_COMBO_FIELD_NUMBER: _ClassVar[int]
    KEY_DOWN_FIELD_NUMBER: _ClassVar[int]
    KEY_PRESS_FIELD_NUMBER: _ClassVar[int]
    KEY_UP_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    SCROLL_FIELD_NUMBER: _ClassVar[int]
    TYPE_TEXT_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    button_down: ButtonAction
    button_up: ButtonAction
    click: ClickAction
    drag: DragAction
    key_combo: KeyComboAction
    key_down: KeyAction
    key_press: KeyAction
    key_up: KeyAction
    move: MoveAction
    scroll: ScrollAction
    type_text: TypeTextAction
    wait: WaitAction
    def __init__(self, move: _Optional[_Union[MoveAction, _Mapping]] = ..., click: _Optional[_Union[ClickAction, _Mapping]] = ..., button_down: _Optional[_Union[ButtonAction, _Mapping]] = ..., button_up: _Optional[_Union[ButtonAction, _Mapping]] = ..., drag: _Optional[_Union[DragAction, _Mapping]] = ..., scroll: _Optional[_Union[ScrollAction, _Mapping]] = ..., key_down: _Optional[_Union[KeyAction, _Mapping]] = ..., key_up: _Optional[_Union[KeyAction, _Mapping]] = ..., key_press: _Optional[_Union[KeyAction, _Mapping]] = ..., key_combo: _Optional[_Union[KeyComboAction, _Mapping]] = ..., type_text: _Optional[_Union[TypeTextAction, _Mapping]] = ..., wait: _Optional[_Union[WaitAction, _Mapping]] = ...) -> None: ...

class ActionOutcome(_message.Message):
    __slots__ = ["duration_ns", "error"]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    duration_ns: int
    error: Error
    def __init__(self, error: _Optional[_Union[Error, _Mapping]] = ..., duration_ns: _Optional[int] = ...) -> None: ...

class ButtonAction(_message.Message):
    __slots__ = ["at", "button"]
    AT_FIELD_NUMBER: _ClassVar[int]
    BUTTON_FIELD_NUMBER: _ClassVar[int]
    at: Point
    button: MouseButton
    def __init__(self, button: _Optional[_Union[MouseButton, str]] = ..., at: _Optional[_Union[Point, _Mapping]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ["target_id"]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    def __init__(self, target_id: _Optional[int] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ["found"]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: bool = ...) -> None: ...

class CheckpointDoneRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class CheckpointDoneResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class CheckpointPrepareRequest(_message.Message):
    __slots__ = ["hold_ms", "settle_ms", "settle_timeout_ms"]
    HOLD_MS_FIELD_NUMBER: _ClassVar[int]
    SETTLE_MS_FIELD_NUMBER: _ClassVar[int]
    SETTLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    hold_ms: int
    settle_ms: int
    settle_timeout_ms: int
    def __init__(self, hold_ms: _Optional[int] = ..., settle_ms: _Optional[int] = ..., settle_timeout_ms: _Optional[int] = ...) -> None: ...

class CheckpointPrepareResponse(_message.Message):
    __slots__ = ["closed_sessions", "frame_hash", "settled"]
    CLOSED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FRAME_HASH_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    closed_sessions: int
    frame_hash: bytes
    settled: bool
    def __init__(self, closed_sessions: _Optional[int] = ..., frame_hash: _Optional[bytes] = ..., settled: bool = ...) -> None: ...

class ClickAction(_message.Message):
    __slots__ = ["at", "button", "count"]
    AT_FIELD_NUMBER: _ClassVar[int]
    BUTTON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    at: Point
    button: MouseButton
    count: int
    def __init__(self, at: _Optional[_Union[Point, _Mapping]] = ..., button: _Optional[_Union[MouseButton, str]] = ..., count: _Optional[int] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ["a11y_action", "a11y_tree", "cancel", "checkpoint_done", "checkpoint_prepare", "clipboard_get", "clipboard_set", "cursor_position", "exec", "file_delete", "file_get", "file_list", "file_mkdir", "file_put", "file_stat", "hello", "id", "launch", "list_windows", "memory_challenge", "memory_mark", "net_probe", "net_probe_listen", "ping", "ready", "release_scratch", "restored", "resume_apps", "screen_size", "screencast_keyframe", "screencast_start", "screencast_stop", "screenshot", "step", "window_action"]
    A11Y_ACTION_FIELD_NUMBER: _ClassVar[int]
    A11Y_TREE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DONE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PREPARE_FIELD_NUMBER: _ClassVar[int]
    CLIPBOARD_GET_FIELD_NUMBER: _ClassVar[int]
    CLIPBOARD_SET_FIELD_NUMBER: _ClassVar[int]
    CURSOR_POSITION_FIELD_NUMBER: _ClassVar[int]
    EXEC_FIELD_NUMBER: _ClassVar[int]
    FILE_DELETE_FIELD_NUMBER: _ClassVar[int]
    FILE_GET_FIELD_NUMBER: _ClassVar[int]
    FILE_LIST_FIELD_NUMBER: _ClassVar[int]
    FILE_MKDIR_FIELD_NUMBER: _ClassVar[int]
    FILE_PUT_FIELD_NUMBER: _ClassVar[int]
    FILE_STAT_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    LIST_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MARK_FIELD_NUMBER: _ClassVar[int]
    NET_PROBE_FIELD_NUMBER: _ClassVar[int]
    NET_PROBE_LISTEN_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RELEASE_SCRATCH_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    RESUME_APPS_FIELD_NUMBER: _ClassVar[int]
    SCREENCAST_KEYFRAME_FIELD_NUMBER: _ClassVar[int]
    SCREENCAST_START_FIELD_NUMBER: _ClassVar[int]
    SCREENCAST_STOP_FIELD_NUMBER: _ClassVar[int]
    SCREENSHOT_FIELD_NUMBER: _ClassVar[int]
    SCREEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WINDOW_ACTION_FIELD_NUMBER: _ClassVar[int]
    a11y_action: A11yActionRequest
    a11y_tree: A11yTreeRequest
    cancel: CancelRequest
    checkpoint_done: CheckpointDoneRequest
    checkpoint_prepare: CheckpointPrepareRequest
    clipboard_get: ClipboardGetRequest
    clipboard_set: ClipboardSetRequest
    cursor_position: CursorPositionRequest
    exec: ExecRequest
    file_delete: FileDeleteRequest
    file_get: FileGetRequest
    file_list: FileListRequest
    file_mkdir: FileMkdirRequest
    file_put: FilePutRequest
    file_stat: FileStatRequest
    hello: HelloRequest
    id: int
    launch: LaunchRequest
    list_windows: ListWindowsRequest
    memory_challenge: MemoryChallengeRequest
    memory_mark: MemoryMarkRequest
    net_probe: NetProbeRequest
    net_probe_listen: NetProbeListenRequest
    ping: PingRequest
    ready: ReadyRequest
    release_scratch: ReleaseScratchRequest
    restored: RestoredRequest
    resume_apps: ResumeAppsRequest
    screen_size: ScreenSizeRequest
    screencast_keyframe: ScreencastKeyframeRequest
    screencast_start: ScreencastStartRequest
    screencast_stop: ScreencastStopRequest
    screenshot: ScreenshotRequest
    step: StepRequest
    window_action: WindowActionRequest
    def __init__(self, id: _Optional[int] = ..., hello: _Optional[_Union[HelloRequest, _Mapping]] = ..., ping: _Optional[_Union[PingRequest, _Mapping]] = ..., step: _Optional[_Union[StepRequest, _Mapping]] = ..., screenshot: _Optional[_Union[ScreenshotRequest, _Mapping]] = ..., ready: _Optional[_Union[ReadyRequest, _Mapping]] = ..., cursor_position: _Optional[_Union[CursorPositionRequest, _Mapping]] = ..., screen_size: _Optional[_Union[ScreenSizeRequest, _Mapping]] = ..., list_windows: _Optional[_Union[ListWindowsRequest, _Mapping]] = ..., window_action: _Optional[_Union[WindowActionRequest, _Mapping]] = ..., launch: _Optional[_Union[LaunchRequest, _Mapping]] = ..., clipboard_get: _Optional[_Union[ClipboardGetRequest, _Mapping]] = ..., clipboard_set: _Optional[_Union[ClipboardSetRequest, _Mapping]] = ..., exec: _Optional[_Union[ExecRequest, _Mapping]] = ..., file_put: _Optional[_Union[FilePutRequest, _Mapping]] = ..., file_get: _Optional[_Union[FileGetRequest, _Mapping]] = ..., file_stat: _Optional[_Union[FileStatRequest, _Mapping]] = ..., file_list: _Optional[_Union[FileListRequest, _Mapping]] = ..., file_mkdir: _Optional[_Union[FileMkdirRequest, _Mapping]] = ..., file_delete: _Optional[_Union[FileDeleteRequest, _Mapping]] = ..., cancel: _Optional[_Union[CancelRequest, _Mapping]] = ..., screencast_start: _Optional[_Union[ScreencastStartRequest, _Mapping]] = ..., screencast_stop: _Optional[_Union[ScreencastStopRequest, _Mapping]] = ..., screencast_keyframe: _Optional[_Union[ScreencastKeyframeRequest, _Mapping]] = ..., memory_mark: _Optional[_Union[MemoryMarkRequest, _Mapping]] = ..., memory_challenge: _Optional[_Union[MemoryChallengeRequest, _Mapping]] = ..., restored: _Optional[_Union[RestoredRequest, _Mapping]] = ..., checkpoint_prepare: _Optional[_Union[CheckpointPrepareRequest, _Mapping]] = ..., checkpoint_done: _Optional[_Union[CheckpointDoneRequest, _Mapping]] = ..., release_scratch: _Optional[_Union[ReleaseScratchRequest, _Mapping]] = ..., net_probe_listen: _Optional[_Union[NetProbeListenRequest, _Mapping]] = ..., net_probe: _Optional[_Union[NetProbeRequest, _Mapping]] = ..., a11y_tree: _Optional[_Union[A11yTreeRequest, _Mapping]] = ..., a11y_action: _Optional[_Union[A11yActionRequest, _Mapping]] = ..., resume_apps: _Optional[_Union[ResumeAppsRequest, _Mapping]] = ...) -> None: ...

class ClipboardGetRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ClipboardGetResponse(_message.Message):
    __slots__ = ["text"]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ClipboardSetRequest(_message.Message):
    __slots__ = ["text"]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ClipboardSetResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class CursorEvent(_message.Message):
    __slots__ = ["position", "stream_id"]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    position: Point
    stream_id: int
    def __init__(self, position: _Optional[_Union[Point, _Mapping]] = ..., stream_id: _Optional[int] = ...) -> None: ...

class CursorPositionRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class CursorPositionResponse(_message.Message):
    __slots__ = ["position"]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: Point
    def __init__(self, position: _Optional[_Union[Point, _Mapping]] = ...) -> None: ...

class DragAction(_message.Message):
    __slots__ = ["button", "steps", "to"]
    BUTTON_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    button: MouseButton
    steps: int
    to: Point
    def __init__(self, to: _Optional[_Union[Point, _Mapping]] = ..., button: _Optional[_Union[MouseButton, str]] = ..., steps: _Optional[int] = ..., **kwargs) -> None: ...

class Error(_message.Message):
    __slots__ = ["code", "field", "message"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    field: str
    message: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ["cursor", "frame", "ready"]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    cursor: CursorEvent
    frame: ScreencastFrame
    ready: ReadyEvent
    def __init__(self, ready: _Optional[_Union[ReadyEvent, _Mapping]] = ..., frame: _Optional[_Union[ScreencastFrame, _Mapping]] = ..., cursor: _Optional[_Union[CursorEvent, _Mapping]] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ["argv", "cwd", "env", "max_output_bytes", "stdin", "timeout_ms"]
    class EnvEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ARGV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    env: _containers.ScalarMap[str, str]
    max_output_bytes: int
    stdin: bytes
    timeout_ms: int
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., stdin: _Optional[bytes] = ..., max_output_bytes: _Optional[int] = ...) -> None: ...

class ExecResponse(_message.Message):
    __slots__ = ["duration_ns", "exit_code", "signal", "stderr", "stderr_truncated", "stdout", "stdout_truncated", "timed_out"]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    duration_ns: int
    exit_code: int
    signal: str
    stderr: bytes
    stderr_truncated: bool
    stdout: bytes
    stdout_truncated: bool
    timed_out: bool
    def __init__(self, exit_code: _Optional[int] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., stdout_truncated: bool = ..., stderr_truncated: bool = ..., timed_out: bool = ..., signal: _Optional[str] = ..., duration_ns: _Optional[int] = ...) -> None: ...

class FileDeleteRequest(_message.Message):
    __slots__ = ["path", "recursive"]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    path: str
    recursive: bool
    def __init__(self, path: _Optional[str] = ..., recursive: bool = ...) -> None: ...

class FileDeleteResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class FileGetRequest(_message.Message):
    __slots__ = ["length", "offset", "path"]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    length: int
    offset: int
    path: str
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class FileGetResponse(_message.Message):
    __slots__ = ["data", "eof", "size"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    eof: bool
    size: int
    def __init__(self, data: _Optional[bytes] = ..., size: _Optional[int] = ..., eof: bool = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ["gid", "is_dir", "is_symlink", "mode", "modified_unix_ns", "name", "size", "uid"]
    GID_FIELD_NUMBER: _ClassVar[int]
    IS_DIR_FIELD_NUMBER: _ClassVar[int]
    IS_SYMLINK_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    gid: int
    is_dir: bool
    is_symlink: bool
    mode: int
    modified_unix_ns: int
    name: str
    size: int
    uid: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., is_dir: bool = ..., is_symlink: bool = ..., modified_unix_ns: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ...) -> None: ...

class FileListRequest(_message.Message):
    __slots__ = ["path"]
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class FileListResponse(_message.Message):
    __slots__ = ["entries"]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ...) -> None: ...

class FileMkdirRequest(_message.Message):
    __slots__ = ["mode", "parents", "path"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    mode: int
    parents: bool
    path: str
    def __init__(self, path: _Optional[str] = ..., parents: bool = ..., mode: _Optional[int] = ...) -> None: ...

class FileMkdirResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class FilePutRequest(_message.Message):
    __slots__ = ["data", "last", "make_parents", "mode", "offset", "path", "upload_id"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    MAKE_PARENTS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    last: bool
    make_parents: bool
    mode: int
    offset: int
    path: str
    upload_id: str
    def __init__(self, path: _Optional[str] = ..., data: _Optional[bytes] = ..., mode: _Optional[int] = ..., make_parents: bool = ..., upload_id: _Optional[str] = ..., offset: _Optional[int] = ..., last: bool = ...) -> None: ...

class FilePutResponse(_message.Message):
    __slots__ = ["published", "size"]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    published: bool
    size: int
    def __init__(self, size: _Optional[int] = ..., published: bool = ...) -> None: ...

class FileStatRequest(_message.Message):
    __slots__ = ["path"]
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class FileStatResponse(_message.Message):
    __slots__ = ["info"]
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: FileInfo
    def __init__(self, info: _Optional[_Union[FileInfo, _Mapping]] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ["capabilities", "client_name", "protocol_version"]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    client_name: str
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ..., client_name: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ["boot_id", "capabilities", "generation", "max_message_bytes", "protocol_version", "sandbox_id", "screen", "server_version", "session_id"]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    SCREEN_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    boot_id: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    max_message_bytes: int
    protocol_version: int
    sandbox_id: str
    screen: ScreenSizeResponse
    server_version: str
    session_id: str
    def __init__(self, protocol_version: _Optional[int] = ..., server_version: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ..., session_id: _Optional[str] = ..., generation: _Optional[int] = ..., sandbox_id: _Optional[str] = ..., screen: _Optional[_Union[ScreenSizeResponse, _Mapping]] = ..., max_message_bytes: _Optional[int] = ..., boot_id: _Optional[str] = ...) -> None: ...

class KeyAction(_message.Message):
    __slots__ = ["key"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class KeyComboAction(_message.Message):
    __slots__ = ["keys"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class LaunchRequest(_message.Message):
    __slots__ = ["argv", "cwd", "env"]
    class EnvEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ARGV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    env: _containers.ScalarMap[str, str]
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ...) -> None: ...

class LaunchResponse(_message.Message):
    __slots__ = ["pid"]
    PID_FIELD_NUMBER: _ClassVar[int]
    pid: int
    def __init__(self, pid: _Optional[int] = ...) -> None: ...

class ListWindowsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListWindowsResponse(_message.Message):
    __slots__ = ["windows"]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    windows: _containers.RepeatedCompositeFieldContainer[Window]
    def __init__(self, windows: _Optional[_Iterable[_Union[Window, _Mapping]]] = ...) -> None: ...

class MemoryChallengeRequest(_message.Message):
    __slots__ = ["nonce"]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    def __init__(self, nonce: _Optional[bytes] = ...) -> None: ...

class MemoryChallengeResponse(_message.Message):
    __slots__ = ["mac"]
    MAC_FIELD_NUMBER: _ClassVar[int]
    mac: bytes
    def __init__(self, mac: _Optional[bytes] = ...) -> None: ...

class MemoryMarkRequest(_message.Message):
    __slots__ = ["value"]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...

class MemoryMarkResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class MoveAction(_message.Message):
    __slots__ = ["to"]
    TO_FIELD_NUMBER: _ClassVar[int]
    to: Point
    def __init__(self, to: _Optional[_Union[Point, _Mapping]] = ...) -> None: ...

class NetProbeListenRequest(_message.Message):
    __slots__ = ["value"]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...

class NetProbeListenResponse(_message.Message):
    __slots__ = ["port"]
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    def __init__(self, port: _Optional[int] = ...) -> None: ...

class NetProbeRequest(_message.Message):
    __slots__ = ["nonce", "port"]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    port: int
    def __init__(self, port: _Optional[int] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class NetProbeResponse(_message.Message):
    __slots__ = ["mac"]
    MAC_FIELD_NUMBER: _ClassVar[int]
    mac: bytes
    def __init__(self, mac: _Optional[bytes] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ["payload"]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ["payload"]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class Point(_message.Message):
    __slots__ = ["x", "y"]
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ...) -> None: ...

class ReadyEvent(_message.Message):
    __slots__ = ["state"]
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: ReadyResponse
    def __init__(self, state: _Optional[_Union[ReadyResponse, _Mapping]] = ...) -> None: ...

class ReadyRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ReadyResponse(_message.Message):
    __slots__ = ["content_ready", "content_ready_ms", "focused", "focused_ms", "painted_ms", "ready", "root_painted", "waiting_for", "windows_mapped", "windows_mapped_ms", "wm_up", "wm_up_ms", "x_up", "x_up_ms"]
    CONTENT_READY_FIELD_NUMBER: _ClassVar[int]
    CONTENT_READY_MS_FIELD_NUMBER: _ClassVar[int]
    FOCUSED_FIELD_NUMBER: _ClassVar[int]
    FOCUSED_MS_FIELD_NUMBER: _ClassVar[int]
    PAINTED_MS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    ROOT_PAINTED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_MAPPED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_MAPPED_MS_FIELD_NUMBER: _ClassVar[int]
    WM_UP_FIELD_NUMBER: _ClassVar[int]
    WM_UP_MS_FIELD_NUMBER: _ClassVar[int]
    X_UP_FIELD_NUMBER: _ClassVar[int]
    X_UP_MS_FIELD_NUMBER: _ClassVar[int]
    content_ready: bool
    content_ready_ms: int
    focused: bool
    focused_ms: int
    painted_ms: int
    ready: bool
    root_painted: bool
    waiting_for: str
    windows_mapped: bool
    windows_mapped_ms: int
    wm_up: bool
    wm_up_ms: int
    x_up: bool
    x_up_ms: int
    def __init__(self, ready: bool = ..., x_up: bool = ..., wm_up: bool = ..., root_painted: bool = ..., x_up_ms: _Optional[int] = ..., wm_up_ms: _Optional[int] = ..., painted_ms: _Optional[int] = ..., windows_mapped: bool = ..., content_ready: bool = ..., focused: bool = ..., windows_mapped_ms: _Optional[int] = ..., content_ready_ms: _Optional[int] = ..., focused_ms: _Optional[int] = ..., waiting_for: _Optional[str] = ...) -> None: ...

class Rect(_message.Message):
    __slots__ = ["height", "width", "x", "y"]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    height: int
    width: int
    x: int
    y: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class ReleaseScratchRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ReleaseScratchResponse(_message.Message):
    __slots__ = ["released_bytes"]
    RELEASED_BYTES_FIELD_NUMBER: _ClassVar[int]
    released_bytes: int
    def __init__(self, released_bytes: _Optional[int] = ...) -> None: ...

class RestoredRequest(_message.Message):
    __slots__ = ["admin_token", "entropy", "generation", "hold_apps", "sandbox_id", "token"]
    ADMIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HOLD_APPS_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    admin_token: str
    entropy: bytes
    generation: int
    hold_apps: bool
    sandbox_id: str
    token: str
    def __init__(self, sandbox_id: _Optional[str] = ..., token: _Optional[str] = ..., generation: _Optional[int] = ..., entropy: _Optional[bytes] = ..., admin_token: _Optional[str] = ..., hold_apps: bool = ...) -> None: ...

class RestoredResponse(_message.Message):
    __slots__ = ["frame_hash"]
    FRAME_HASH_FIELD_NUMBER: _ClassVar[int]
    frame_hash: bytes
    def __init__(self, frame_hash: _Optional[bytes] = ...) -> None: ...

class ResumeAppsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ResumeAppsResponse(_message.Message):
    __slots__ = ["resumed"]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    resumed: int
    def __init__(self, resumed: _Optional[int] = ...) -> None: ...

class ScreenSizeRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ScreenSizeResponse(_message.Message):
    __slots__ = ["height", "width"]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    height: int
    width: int
    def __init__(self, width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class ScreencastFrame(_message.Message):
    __slots__ = ["captured_at_delta_us", "captured_at_ns", "coalesced", "format", "frame_hash", "height", "keyframe", "seq", "stream_id", "tiles", "width", "zlib_chunk"]
    CAPTURED_AT_DELTA_US_FIELD_NUMBER: _ClassVar[int]
    CAPTURED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    COALESCED_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FRAME_HASH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    KEYFRAME_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TILES_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    ZLIB_CHUNK_FIELD_NUMBER: _ClassVar[int]
    captured_at_delta_us: int
    captured_at_ns: int
    coalesced: int
    format: ImageFormat
    frame_hash: bytes
    height: int
    keyframe: bool
    seq: int
    stream_id: int
    tiles: _containers.RepeatedCompositeFieldContainer[Tile]
    width: int
    zlib_chunk: bytes
    def __init__(self, stream_id: _Optional[int] = ..., seq: _Optional[int] = ..., captured_at_ns: _Optional[int] = ..., keyframe: bool = ..., format: _Optional[_Union[ImageFormat, str]] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., tiles: _Optional[_Iterable[_Union[Tile, _Mapping]]] = ..., coalesced: _Optional[int] = ..., frame_hash: _Optional[bytes] = ..., captured_at_delta_us: _Optional[int] = ..., zlib_chunk: _Optional[bytes] = ...) -> None: ...

class ScreencastKeyframeRequest(_message.Message):
    __slots__ = ["stream_id"]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    def __init__(self, stream_id: _Optional[int] = ...) -> None: ...

class ScreencastKeyframeResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ScreencastStartRequest(_message.Message):
    __slots__ = ["cursor", "delta", "format", "fps", "frame_hashes", "keyframe_interval_ms", "max_long_edge", "quality", "region"]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    FRAME_HASHES_FIELD_NUMBER: _ClassVar[int]
    KEYFRAME_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_LONG_EDGE_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    cursor: CursorMode
    delta: bool
    format: ImageFormat
    fps: int
    frame_hashes: bool
    keyframe_interval_ms: int
    max_long_edge: int
    quality: int
    region: Rect
    def __init__(self, fps: _Optional[int] = ..., format: _Optional[_Union[ImageFormat, str]] = ..., quality: _Optional[int] = ..., delta: bool = ..., keyframe_interval_ms: _Optional[int] = ..., max_long_edge: _Optional[int] = ..., region: _Optional[_Union[Rect, _Mapping]] = ..., cursor: _Optional[_Union[CursorMode, str]] = ..., frame_hashes: bool = ...) -> None: ...

class ScreencastStartResponse(_message.Message):
    __slots__ = ["stream_id"]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    def __init__(self, stream_id: _Optional[int] = ...) -> None: ...

class ScreencastStopRequest(_message.Message):
    __slots__ = ["stream_id"]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    def __init__(self, stream_id: _Optional[int] = ...) -> None: ...

class ScreencastStopResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ScreenshotRequest(_message.Message):
    __slots__ = ["format", "if_none_match", "include_cursor", "max_long_edge", "quality", "region", "settle_ms", "settle_timeout_ms"]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    IF_NONE_MATCH_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CURSOR_FIELD_NUMBER: _ClassVar[int]
    MAX_LONG_EDGE_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    SETTLE_MS_FIELD_NUMBER: _ClassVar[int]
    SETTLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    format: ImageFormat
    if_none_match: bytes
    include_cursor: bool
    max_long_edge: int
    quality: int
    region: Rect
    settle_ms: int
    settle_timeout_ms: int
    def __init__(self, format: _Optional[_Union[ImageFormat, str]] = ..., quality: _Optional[int] = ..., region: _Optional[_Union[Rect, _Mapping]] = ..., max_long_edge: _Optional[int] = ..., include_cursor: bool = ..., if_none_match: _Optional[bytes] = ..., settle_ms: _Optional[int] = ..., settle_timeout_ms: _Optional[int] = ...) -> None: ...

class ScreenshotResponse(_message.Message):
    __slots__ = ["capture_ns", "captured_at_ns", "data", "encode_ns", "format", "frame_hash", "height", "not_modified", "region", "width"]
    CAPTURED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_NS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ENCODE_NS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FRAME_HASH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    NOT_MODIFIED_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    capture_ns: int
    captured_at_ns: int
    data: bytes
    encode_ns: int
    format: ImageFormat
    frame_hash: bytes
    height: int
    not_modified: bool
    region: Rect
    width: int
    def __init__(self, format: _Optional[_Union[ImageFormat, str]] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., data: _Optional[bytes] = ..., frame_hash: _Optional[bytes] = ..., not_modified: bool = ..., region: _Optional[_Union[Rect, _Mapping]] = ..., capture_ns: _Optional[int] = ..., encode_ns: _Optional[int] = ..., captured_at_ns: _Optional[int] = ...) -> None: ...

class ScrollAction(_message.Message):
    __slots__ = ["at", "dx", "dy"]
    AT_FIELD_NUMBER: _ClassVar[int]
    DX_FIELD_NUMBER: _ClassVar[int]
    DY_FIELD_NUMBER: _ClassVar[int]
    at: Point
    dx: int
    dy: int
    def __init__(self, at: _Optional[_Union[Point, _Mapping]] = ..., dx: _Optional[int] = ..., dy: _Optional[int] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ["a11y_action", "a11y_tree", "cancel", "checkpoint_done", "checkpoint_prepare", "clipboard_get", "clipboard_set", "cursor_position", "error", "event", "exec", "file_delete", "file_get", "file_list", "file_mkdir", "file_put", "file_stat", "hello", "id", "launch", "list_windows", "memory_challenge", "memory_mark", "net_probe", "net_probe_listen", "ping", "ready", "release_scratch", "restored", "resume_apps", "screen_size", "screencast_keyframe", "screencast_start", "screencast_stop", "screenshot", "step", "window_action"]
    A11Y_ACTION_FIELD_NUMBER: _ClassVar[int]
    A11Y_TREE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DONE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PREPARE_FIELD_NUMBER: _ClassVar[int]
    CLIPBOARD_GET_FIELD_NUMBER: _ClassVar[int]
    CLIPBOARD_SET_FIELD_NUMBER: _ClassVar[int]
    CURSOR_POSITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    EXEC_FIELD_NUMBER: _ClassVar[int]
    FILE_DELETE_FIELD_NUMBER: _ClassVar[int]
    FILE_GET_FIELD_NUMBER: _ClassVar[int]
    FILE_LIST_FIELD_NUMBER: _ClassVar[int]
    FILE_MKDIR_FIELD_NUMBER: _ClassVar[int]
    FILE_PUT_FIELD_NUMBER: _ClassVar[int]
    FILE_STAT_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    LIST_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MARK_FIELD_NUMBER: _ClassVar[int]
    NET_PROBE_FIELD_NUMBER: _ClassVar[int]
    NET_PROBE_LISTEN_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RELEASE_SCRATCH_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    RESUME_APPS_FIELD_NUMBER: _ClassVar[int]
    SCREENCAST_KEYFRAME_FIELD_NUMBER: _ClassVar[int]
    SCREENCAST_START_FIELD_NUMBER: _ClassVar[int]
    SCREENCAST_STOP_FIELD_NUMBER: _ClassVar[int]
    SCREENSHOT_FIELD_NUMBER: _ClassVar[int]
    SCREEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WINDOW_ACTION_FIELD_NUMBER: _ClassVar[int]
    a11y_action: A11yActionResponse
    a11y_tree: A11yTreeResponse
    cancel: CancelResponse
    checkpoint_done: CheckpointDoneResponse
    checkpoint_prepare: CheckpointPrepareResponse
    clipboard_get: ClipboardGetResponse
    clipboard_set: ClipboardSetResponse
    cursor_position: CursorPositionResponse
    error: Error
    event: Event
    exec: ExecResponse
    file_delete: FileDeleteResponse
    file_get: FileGetResponse
    file_list: FileListResponse
    file_mkdir: FileMkdirResponse
    file_put: FilePutResponse
    file_stat: FileStatResponse
    hello: HelloResponse
    id: int
    launch: LaunchResponse
    list_windows: ListWindowsResponse
    memory_challenge: MemoryChallengeResponse
    memory_mark: MemoryMarkResponse
    net_probe: NetProbeResponse
    net_probe_listen: NetProbeListenResponse
    ping: PingResponse
    ready: ReadyResponse
    release_scratch: ReleaseScratchResponse
    restored: RestoredResponse
    resume_apps: ResumeAppsResponse
    screen_size: ScreenSizeResponse
    screencast_keyframe: ScreencastKeyframeResponse
    screencast_start: ScreencastStartResponse
    screencast_stop: ScreencastStopResponse
    screenshot: ScreenshotResponse
    step: StepResponse
    window_action: WindowActionResponse
    def __init__(self, id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., hello: _Optional[_Union[HelloResponse, _Mapping]] = ..., ping: _Optional[_Union[PingResponse, _Mapping]] = ..., step: _Optional[_Union[StepResponse, _Mapping]] = ..., screenshot: _Optional[_Union[ScreenshotResponse, _Mapping]] = ..., ready: _Optional[_Union[ReadyResponse, _Mapping]] = ..., cursor_position: _Optional[_Union[CursorPositionResponse, _Mapping]] = ..., screen_size: _Optional[_Union[ScreenSizeResponse, _Mapping]] = ..., list_windows: _Optional[_Union[ListWindowsResponse, _Mapping]] = ..., window_action: _Optional[_Union[WindowActionResponse, _Mapping]] = ..., launch: _Optional[_Union[LaunchResponse, _Mapping]] = ..., clipboard_get: _Optional[_Union[ClipboardGetResponse, _Mapping]] = ..., clipboard_set: _Optional[_Union[ClipboardSetResponse, _Mapping]] = ..., exec: _Optional[_Union[ExecResponse, _Mapping]] = ..., file_put: _Optional[_Union[FilePutResponse, _Mapping]] = ..., file_get: _Optional[_Union[FileGetResponse, _Mapping]] = ..., file_stat: _Optional[_Union[FileStatResponse, _Mapping]] = ..., file_list: _Optional[_Union[FileListResponse, _Mapping]] = ..., file_mkdir: _Optional[_Union[FileMkdirResponse, _Mapping]] = ..., file_delete: _Optional[_Union[FileDeleteResponse, _Mapping]] = ..., cancel: _Optional[_Union[CancelResponse, _Mapping]] = ..., screencast_start: _Optional[_Union[ScreencastStartResponse, _Mapping]] = ..., screencast_stop: _Optional[_Union[ScreencastStopResponse, _Mapping]] = ..., screencast_keyframe: _Optional[_Union[ScreencastKeyframeResponse, _Mapping]] = ..., memory_mark: _Optional[_Union[MemoryMarkResponse, _Mapping]] = ..., memory_challenge: _Optional[_Union[MemoryChallengeResponse, _Mapping]] = ..., restored: _Optional[_Union[RestoredResponse, _Mapping]] = ..., checkpoint_prepare: _Optional[_Union[CheckpointPrepareResponse, _Mapping]] = ..., checkpoint_done: _Optional[_Union[CheckpointDoneResponse, _Mapping]] = ..., release_scratch: _Optional[_Union[ReleaseScratchResponse, _Mapping]] = ..., net_probe_listen: _Optional[_Union[NetProbeListenResponse, _Mapping]] = ..., net_probe: _Optional[_Union[NetProbeResponse, _Mapping]] = ..., a11y_tree: _Optional[_Union[A11yTreeResponse, _Mapping]] = ..., a11y_action: _Optional[_Union[A11yActionResponse, _Mapping]] = ..., resume_apps: _Optional[_Union[ResumeAppsResponse, _Mapping]] = ..., event: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ["actions", "observe", "observe_tree", "stop_on_error"]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_TREE_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_ERROR_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[Action]
    observe: ScreenshotRequest
    observe_tree: A11yTreeRequest
    stop_on_error: bool
    def __init__(self, actions: _Optional[_Iterable[_Union[Action, _Mapping]]] = ..., stop_on_error: bool = ..., observe: _Optional[_Union[ScreenshotRequest, _Mapping]] = ..., observe_tree: _Optional[_Union[A11yTreeRequest, _Mapping]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ["observation", "observation_error", "outcomes", "tree", "tree_error"]
    OBSERVATION_ERROR_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    TREE_ERROR_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    observation: ScreenshotResponse
    observation_error: Error
    outcomes: _containers.RepeatedCompositeFieldContainer[ActionOutcome]
    tree: A11yTreeResponse
    tree_error: Error
    def __init__(self, outcomes: _Optional[_Iterable[_Union[ActionOutcome, _Mapping]]] = ..., observation: _Optional[_Union[ScreenshotResponse, _Mapping]] = ..., observation_error: _Optional[_Union[Error, _Mapping]] = ..., tree: _Optional[_Union[A11yTreeResponse, _Mapping]] = ..., tree_error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class Tile(_message.Message):
    __slots__ = ["data", "rect"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RECT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    rect: Rect
    def __init__(self, rect: _Optional[_Union[Rect, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TypeTextAction(_message.Message):
    __slots__ = ["text"]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class WaitAction(_message.Message):
    __slots__ = ["milliseconds"]
    MILLISECONDS_FIELD_NUMBER: _ClassVar[int]
    milliseconds: int
    def __init__(self, milliseconds: _Optional[int] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ["desktop", "focused", "geometry", "id", "instance", "maximized", "minimized", "pid", "title"]
    CLASS_FIELD_NUMBER: _ClassVar[int]
    DESKTOP_FIELD_NUMBER: _ClassVar[int]
    FOCUSED_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    MAXIMIZED_FIELD_NUMBER: _ClassVar[int]
    MINIMIZED_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    desktop: int
    focused: bool
    geometry: Rect
    id: int
    instance: str
    maximized: bool
    minimized: bool
    pid: int
    title: str
    def __init__(self, id: _Optional[int] = ..., title: _Optional[str] = ..., instance: _Optional[str] = ..., pid: _Optional[int] = ..., geometry: _Optional[_Union[Rect, _Mapping]] = ..., focused: bool = ..., minimized: bool = ..., maximized: bool = ..., desktop: _Optional[int] = ..., **kwargs) -> None: ...

class WindowActionRequest(_message.Message):
    __slots__ = ["geometry", "op", "window_id"]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    WINDOW_ID_FIELD_NUMBER: _ClassVar[int]
    geometry: Rect
    op: WindowOp
    window_id: int
    def __init__(self, window_id: _Optional[int] = ..., op: _Optional[_Union[WindowOp, str]] = ..., geometry: _Optional[_Union[Rect, _Mapping]] = ...) -> None: ...

class WindowActionResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class MouseButton(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ImageFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class WindowOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CursorMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class A11yRoot(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class A11yField(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class A11yActionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
