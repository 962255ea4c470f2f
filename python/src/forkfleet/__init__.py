"""forkfleet: desktop sandboxes for computer-use agents.

- :class:`Client` / :class:`AsyncClient`: controld's API (sandboxes,
  checkpoints, forks, export/import, pools).
- :mod:`forkfleet.aci`: ACI sessions to a sandbox (actions, observations,
  files, exec, screencast), with a shared :class:`~forkfleet.aci.FrameCache`.
- :mod:`forkfleet.screencast`: the screencast compositor (numpy frames).
- :mod:`forkfleet.env`: gymnasium-style environments, one sandbox or N
  replicas of a checkpoint.
- :mod:`forkfleet.adapters`: Anthropic and OpenAI computer-use actions.

Errors are the classes of :mod:`forkfleet.errors`, re-exported here.
"""

from forkfleet.client import (DEFAULT_ADDRESS, AsyncCheckpoint, AsyncClient, AsyncRecording, AsyncSandbox, Checkpoint,
                              Claim, Client, ForkResult, Recording, Sandbox, first_error, sandboxes)
from forkfleet.errors import (AlreadyExists, Canceled, ConnectionLost, DeadlineExceeded, FailedPrecondition,
                              ForkfleetError, Internal, InvalidArgument, NotFound, PermissionDenied, ProtocolError,
                              ResourceExhausted, SessionClosed, Unauthenticated, Unavailable, Unimplemented)

__version__ = "0.1.0"

__all__ = [
    "Client", "AsyncClient", "Sandbox", "AsyncSandbox", "Checkpoint", "AsyncCheckpoint", "ForkResult", "Claim",
    "Recording", "AsyncRecording", "sandboxes", "first_error", "DEFAULT_ADDRESS",
    "ForkfleetError", "InvalidArgument", "NotFound", "AlreadyExists", "FailedPrecondition", "ResourceExhausted",
    "Unavailable", "DeadlineExceeded", "Canceled", "PermissionDenied", "Unauthenticated", "Internal",
    "Unimplemented", "ConnectionLost", "SessionClosed", "ProtocolError",
]
