"""Test environment of the Python SDK.

Two controlds:

- ``fake``: api/controldfake (the Go in-memory controld that follows
  controld's validation rules) served by api/cmd/controldfake on a unix
  socket, every sandbox's ACI endpoint one acitest fake guestd. Always runs
  (it needs the go tool).
- ``stack``: the real controld binary of this checkout with its own config,
  state dir, socket and containerd namespace (``forkfleet-python-it`` plus
  ``-$FORKFLEET_TEST_SUFFIX``), booting the desktop image through
  containerd, runc and CRIU. Runs with FORKFLEET_INTEGRATION=1 (``make
  test``) and then fails loudly, never skips, when the machine cannot run it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

REPO = pathlib.Path(os.environ.get("FORKFLEET_REPO", pathlib.Path(__file__).resolve().parents[2]))
INTEGRATION = os.environ.get("FORKFLEET_INTEGRATION") == "1"


def run_async(fn):
    """Runs an async test function on a fresh event loop."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 120))
    return wrapper


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if go is None:
        pytest.fail("the go tool is needed to build the test helpers (controldfake, controld)")
    return go


@pytest.fixture(scope="session")
def bindir():
    d = tempfile.mkdtemp(prefix="forkfleet-py-bin-")
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


def go_build(bindir: pathlib.Path, module: str, pkg: str, name: str, cgo: bool = True) -> str:
    out = bindir / name
    if not out.exists():
        env = dict(os.environ, CGO_ENABLED="1" if cgo else "0")
        r = subprocess.run([_go(), "build", "-o", str(out), pkg], cwd=REPO / module, capture_output=True, text=True,
                           env=env)
        if r.returncode != 0:
            pytest.fail(f"go build {pkg}: {r.stderr}")
    return str(out)


class Fake:
    """A running api/cmd/controldfake."""

    def __init__(self, binary: str, token: str = "", hosts: str = ""):
        self.dir = tempfile.mkdtemp(prefix="ffpy-")
        args = [binary, "--socket", os.path.join(self.dir, "controld.sock")]
        if token:
            args += ["--token", token]
        if hosts:
            args += ["--hosts", hosts]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        info = json.loads(self.proc.stdout.readline())
        self.target, self.aci_url, self.aci_token = info["target"], info["aci_url"], info["aci_token"]
        # host name -> target, with hosts: fakes standing in for a fleet.
        self.hosts = info.get("hosts") or {}

    def command(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer == "ok", f"controldfake {line!r}: {answer}"

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def fake_binary(bindir):
    return go_build(bindir, "api", "./cmd/controldfake", "controldfake")


@pytest.fixture(scope="session")
def fake(fake_binary):
    f = Fake(fake_binary)
    yield f
    f.close()


@pytest.fixture()
def fresh_fake(fake_binary):
    """A fake of the test's own (for tests that change its behaviour)."""
    f = Fake(fake_binary)
    yield f
    f.close()


# ---- the real stack


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """controld of this checkout on the real containerd, in its own namespace."""

    def __init__(self, bindir: pathlib.Path):
        if os.geteuid() != 0:
            pytest.fail("FORKFLEET_INTEGRATION=1 needs root (containerd, cgroups, CRIU)")
        address = os.environ.get("FORKFLEET_CONTAINERD_ADDRESS", "/run/forkfleet/containerd/containerd.sock")
        if not os.path.exists(address):
            pytest.fail(f"FORKFLEET_INTEGRATION=1 but containerd is not at {address} (make test sets it up)")
        suffix = os.environ.get("FORKFLEET_TEST_SUFFIX", "")
        self.namespace = "forkfleet-python-it" + (f"-{suffix}" if suffix else "")
        layout = "/var/cache/forkfleet/images/desktop-oci"
        if not os.path.exists(os.path.join(layout, "index.json")):
            pytest.fail(f"no desktop image layout at {layout}: build it with `make image` (make test does)")
        controld = go_build(bindir, "controld", "./cmd/controld", "controld")
        # controld runs them beside itself (the log writer, runc's network
        # hook); static, as make build builds them.
        go_build(bindir, "controld", "./cmd/forkfleet-log", "forkfleet-log", cgo=False)
        go_build(bindir, "controld", "./cmd/forkfleet-nethook", "forkfleet-nethook", cgo=False)
        image_tool = go_build(bindir, "controld", "./cmd/forkfleet-image", "forkfleet-image")
        r = subprocess.run([image_tool, "import", "--address", address, "--namespace", self.namespace, layout],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"import the desktop image into {self.namespace}: {r.stderr}")
        self.dir = tempfile.mkdtemp(prefix="ffpy-stack-")
        self.socket = os.path.join(self.dir, "controld.sock")
        self.target = "unix://" + self.socket
        self.log = os.path.join(self.dir, "controld.log")
        cfg = os.path.join(self.dir, "controld.toml")
        self.token = "python-it-" + os.urandom(8).hex()
        with open(os.path.join(self.dir, "api.token"), "w") as f:
            f.write(self.token + "\n")
        gateway = f"127.0.0.1:{_free_port()}"
        with open(cfg, "w") as f:
            f.write(f"""state_dir = "{self.dir}/state"
checkpoint_dir = "{self.dir}/checkpoints"
default_image = "localhost/forkfleet/desktop:latest"
boot_timeout = "60s"
shutdown_timeout = "30s"
[boot]
precreate = 0
[grpc]
unix_socket = "{self.socket}"
tcp_address = ""
token_file = "{self.dir}/api.token"
[gateway]
listen = "{gateway}"
[metrics]
listen = "127.0.0.1:0"
[containerd]
address = "{address}"
namespace = "{self.namespace}"
""")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FORKFLEET_CONTAINERD_", "OTEL_", "NOTIFY_SOCKET"))}
        env["FORKFLEET_CONTAINERD_NAMESPACE"] = self.namespace
        env["FORKFLEET_CONTAINERD_ADDRESS"] = address
        notify = os.path.join(self.dir, "notify.sock")
        env["NOTIFY_SOCKET"] = notify
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ns.bind(notify)
        ns.settimeout(120)
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen([controld, "--config", cfg], env=env, stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                msg = ns.recv(4096).decode()
                if "READY=1" in msg:
                    break
                if self.proc.poll() is not None:
                    break
        except socket.timeout:
            pass
        finally:
            ns.close()
        if self.proc.poll() is not None or not os.path.exists(self.socket):
            log = self.tail()
            self.close()
            pytest.fail(f"controld did not start:\n{log}")

    def tail(self, n: int = 8000) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def cleanup(self) -> None:
        """Deletes every sandbox, pool and checkpoint the tests left."""
        import forkfleet
        with forkfleet.Client(self.target, token=self.token, timeout=60) as c:
            for p in c.list_pools():
                c.delete_pool(p.id)
            for sb in c.list_sandboxes():
                try:
                    c.sandbox(sb.id).delete()
                except forkfleet.NotFound:
                    pass
            for ck in c.list_checkpoints():
                if not ck.parent_checkpoint_id:
                    try:
                        c.checkpoint(ck.id).delete(cascade=True)
                    except forkfleet.NotFound:
                        pass

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        # Keep the log of the last run for a look after a failure.
        shutil.copyfile(self.log, os.path.join(tempfile.gettempdir(), f"{self.namespace}-controld.log"))
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def stack(bindir):
    if not INTEGRATION:
        pytest.skip("set FORKFLEET_INTEGRATION=1 to run against containerd, runc and CRIU")
    s = Stack(bindir)
    try:
        yield s
    finally:
        try:
            s.cleanup()
        finally:
            s.close()
