"""Error classes: the Python side of api/errdefs.

Every error the SDK raises is a :class:`ForkfleetError` of one class, whether
it came from controld (a gRPC status), from guestd (an ACI ``Error`` reply) or
from the client itself, so callers catch one class for one meaning::

    try:
        sb = client.get_sandbox("sb-000001")
    except forkfleet.NotFound as e:
        print(e.reason)           # "SANDBOX_NOT_FOUND" (google.rpc.ErrorInfo)
    except forkfleet.InvalidArgument as e:
        print(e.field)            # "id" (google.rpc.BadRequest)

The mapping is the Go client's (errdefs.FromGRPC and aci.Error.Unwrap): a
gRPC code without a class, and an ACI code this client does not know, are
:class:`Internal`.
"""

from __future__ import annotations

import grpc

from forkfleet.aci.v1 import aci_pb2

__all__ = [
    "ForkfleetError",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "FailedPrecondition",
    "ResourceExhausted",
    "Unavailable",
    "DeadlineExceeded",
    "Canceled",
    "PermissionDenied",
    "Unauthenticated",
    "Internal",
    "Unimplemented",
    "ConnectionLost",
    "SessionClosed",
    "ProtocolError",
    "from_grpc",
    "from_aci",
]

DOMAIN = "forkfleet.dev"


class ForkfleetError(Exception):
    """Base of every SDK error.

    Attributes:
        message: the server's (or client's) human-readable text.
        field: the request field at fault, as a dotted path, when named
            (BadRequest on gRPC, ``Error.field`` on the ACI).
        reason: the machine-readable reason of a controld error
            ("SANDBOX_NOT_FOUND"), from google.rpc.ErrorInfo.
        grpc_code: the gRPC status code of a controld error.
        aci_code: the ACI ``ErrorCode`` of a guestd error reply.
    """

    def __init__(self, message: str = "", *, field: str = "", reason: str = "",
                 grpc_code: grpc.StatusCode | None = None, aci_code: int = 0):
        super().__init__(message)
        self.message = message
        self.field = field
        self.reason = reason
        self.grpc_code = grpc_code
        self.aci_code = aci_code

    def __str__(self) -> str:
        if self.field and self.field not in self.message:
            return f"{self.field}: {self.message}"
        return self.message


class InvalidArgument(ForkfleetError, ValueError):
    """A malformed request or a field out of range (``field`` names it)."""


class NotFound(ForkfleetError, LookupError):
    """The sandbox, checkpoint, pool, image, file or window does not exist."""


class AlreadyExists(ForkfleetError):
    """A name or path is taken."""


class FailedPrecondition(ForkfleetError):
    """The target is in the wrong state for the request."""


class ResourceExhausted(ForkfleetError):
    """A limit was reached (capacity, sizes, streams)."""


class Unavailable(ForkfleetError):
    """The service or the desktop is not reachable or not up yet; retrying may work."""


class DeadlineExceeded(ForkfleetError, TimeoutError):
    """The call's timeout passed (client side or server side)."""


class Canceled(ForkfleetError):
    """The request was canceled (by the caller, or by the server cutting it short)."""


class PermissionDenied(ForkfleetError, PermissionError):
    """The credentials do not allow the request (a wrong ACI token, an admin-only request)."""


class Unauthenticated(ForkfleetError):
    """controld refused the bearer token."""


class Internal(ForkfleetError):
    """A bug or an unexpected failure on the other side."""


class Unimplemented(ForkfleetError, NotImplementedError):
    """The server does not know the request kind (an older guestd); ACI only."""


class ConnectionLost(Unavailable):
    """The ACI connection dropped while the request was in flight: it may or may not have run."""


class SessionClosed(ForkfleetError):
    """The ACI session was closed by the caller."""


class ProtocolError(ForkfleetError):
    """The peer broke the framing rules (a reply of the wrong kind, an undecodable frame)."""


_GRPC_CLASSES: dict[grpc.StatusCode, type[ForkfleetError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Canceled,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.INTERNAL: Internal,
}

_GRPC_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}

E = aci_pb2.ErrorCode
_ACI_CLASSES: dict[int, type[ForkfleetError]] = {
    E.ERROR_CODE_INVALID_ARGUMENT: InvalidArgument,
    E.ERROR_CODE_NOT_FOUND: NotFound,
    E.ERROR_CODE_ALREADY_EXISTS: AlreadyExists,
    E.ERROR_CODE_PERMISSION_DENIED: PermissionDenied,
    E.ERROR_CODE_TIMEOUT: DeadlineExceeded,
    E.ERROR_CODE_UNAVAILABLE: Unavailable,
    E.ERROR_CODE_RESOURCE_EXHAUSTED: ResourceExhausted,
    E.ERROR_CODE_FAILED_PRECONDITION: FailedPrecondition,
    E.ERROR_CODE_UNIMPLEMENTED: Unimplemented,
    E.ERROR_CODE_CANCELED: Canceled,
}
del E


def grpc_class(code: grpc.StatusCode) -> type[ForkfleetError]:
    """The class of a gRPC status code (Internal for codes without one)."""
    return _GRPC_CLASSES.get(code, Internal)


def from_grpc(err: grpc.RpcError) -> ForkfleetError:
    """Converts a gRPC error (sync or aio) into its class, with the field of
    a BadRequest and the reason of an ErrorInfo detail."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    field, reason = "", ""
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            field, reason = _status_details(value)
    return grpc_class(code)(message or "", field=field, reason=reason, grpc_code=code)


def from_code(code: int, message: str) -> ForkfleetError:
    """Converts a numeric gRPC code and message (a fork replica's error) into its class."""
    status = _GRPC_BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    return grpc_class(status)(message, grpc_code=status)


def from_aci(e: aci_pb2.Error) -> ForkfleetError:
    """Converts an ACI Error reply into its class (``aci_code`` keeps the code)."""
    cls = _ACI_CLASSES.get(e.code, Internal)
    name = aci_pb2.ErrorCode.Name(e.code) if e.code in aci_pb2.ErrorCode.values() else str(e.code)
    return cls(f"aci: {name}: {e.message}", field=e.field, aci_code=e.code)


# google.rpc.Status travels as serialized bytes in the grpc-status-details-bin
# trailer. Decoding its three small messages by hand spares a dependency on
# googleapis-common-protos (not among the Debian packages this SDK uses).
_BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def _status_details(b: bytes) -> tuple[str, str]:
    """Returns (field of the first BadRequest violation, ErrorInfo reason)."""
    field, reason = "", ""
    try:
        for num, val in _fields(b):
            if num != 3 or not isinstance(val, bytes):  # Status.details (Any)
                continue
            any_fields = dict((n, v) for n, v in _fields(val))
            type_url, body = any_fields.get(1, b""), any_fields.get(2, b"")
            if not isinstance(type_url, bytes) or not isinstance(body, bytes):
                continue
            if type_url.decode() == _BAD_REQUEST and not field:
                for n, v in _fields(body):  # field_violations
                    if n == 1 and isinstance(v, bytes):
                        f = dict(_fields(v)).get(1, b"")
                        if isinstance(f, bytes):
                            field = f.decode("utf-8", "replace")
                            break
            elif type_url.decode() == _ERROR_INFO:
                r = dict(_fields(body)).get(1, b"")
                if isinstance(r, bytes):
                    reason = r.decode("utf-8", "replace")
    except (ValueError, UnicodeDecodeError):
        return "", ""
    return field, reason


def _fields(b: bytes):
    """Yields (field number, value) of a protobuf message: ints for varints,
    bytes for length-delimited fields; fixed-width fields are skipped."""
    i, n = 0, len(b)

    def varint() -> int:
        nonlocal i
        shift = result = 0
        while True:
            if i >= n or shift > 63:
                raise ValueError("truncated varint")
            c = b[i]
            i += 1
            result |= (c & 0x7F) << shift
            if c < 0x80:
                return result
            shift += 7

    while i < n:
        key = varint()
        num, wt = key >> 3, key & 7
        if wt == 0:
            yield num, varint()
        elif wt == 2:
            ln = varint()
            if i + ln > n:
                raise ValueError("truncated field")
            yield num, bytes(b[i:i + ln])
            i += ln
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wt}")
