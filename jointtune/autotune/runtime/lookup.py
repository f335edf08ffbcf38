"""Where the decorator finds a config for a key it hasn't seen: local store, then the service.

Both sources are optional and neither may break a run: a store that can't be opened (a corrupt
file), answers an error or takes longer than `store_timeout_s` (a lock held elsewhere) is
skipped with one warning and not asked again in this process; the service client never raises, ends
each lookup within its deadline, and hands over the service's answer parsed with the store's own model
of it (`jointtune.db.LookupOut`). A malformed $JOINTTUNE_SERVER is deployment configuration, like an
unreachable service: one warning, no service. Publishing a tuned result never holds the call longer
than the client's lookup deadline: what is left of it goes on in the background (`wait_for_publishes`).

Records that don't fit are not used silently. A record of another Triton major.minor, or whose
config the current space (or config list) rejects, is skipped with a warning and counts as a
miss. Records of another kernel source version are never returned by the versioned queries; when
the store holds one for the exact key, a warning says so. `nearest` only considers records of
the current kernel version and Triton major.minor, so a miss never picks up a stale config.

Example:
    >>> sources = Sources(db_url="sqlite:////tmp/jt.db", client=None)              # doctest: +SKIP
    >>> sources.exact(identity, {"M": 64, "N": 64, "K": 128}, accept=lambda c: None)  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import math
import numbers
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from jointtune._warnings import warn
from jointtune.errors import JointtuneError, StoreError, TuningError
from jointtune.timings import INTERP

if TYPE_CHECKING:
    from jointtune.autotune.runtime.client import ConfigClient
    from jointtune.db import NewRecord, Store

T = TypeVar("T")

#: how long one store operation may take before the decorator gives up on the store
DEFAULT_STORE_TIMEOUT_S = 10.0

#: how long the end of the process waits, in all, for publishes still under way in the background
PUBLISH_EXIT_WAIT_S = 5.0

#: a config the caller can't use -> why (None: usable)
Accept = Callable[[Mapping[str, Any]], "str | None"]


class LookupWarning(UserWarning):
    """A source or a record could not be used; the decorator falls back to the next one."""


class ArgumentError(TuningError, ValueError):
    """A `joint_autotune` argument that can't work (named, with what is allowed), raised when it decorates."""


_WARNED: set[str] = set()


def warn_once(cause: str, message: str, category: type[Warning] = LookupWarning) -> None:
    """Warn once per cause per process: a broken source costs one line, not a log flood."""
    if cause not in _WARNED:
        _WARNED.add(cause)
        warn(message, category)


def check_store_timeout(value: Any) -> float:
    """`store_timeout_s` as float seconds; ValueError (a TuningError) unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ArgumentError(
            f"store_timeout_s: {value!r} is not allowed; it must be a finite number of seconds > 0 "
            f"(default {DEFAULT_STORE_TIMEOUT_S:g})"
        )
    return float(value)


def check_server(server: Any) -> None:
    """A `server=` argument: None or "" (then $JOINTTUNE_SERVER decides) or the URL of a service."""
    from jointtune.autotune.runtime.client import check_base_url

    if server is None or server == "":
        return
    try:
        check_base_url(server)
    except JointtuneError as exc:
        raise ArgumentError(str(exc).replace("base_url:", "server:", 1)) from None


def make_client(server: str | None) -> ConfigClient | None:
    """A client for `server` (or $JOINTTUNE_SERVER), with $JOINTTUNE_TOKEN for publishing; None if neither.

    A malformed `server` raises (the decorator checks it when it decorates); a malformed $JOINTTUNE_SERVER
    is deployment configuration and must not stop a job: one warning, then no service, as when it is down."""
    import os

    from jointtune.autotune.runtime.client import ENV_SERVER, ENV_TOKEN, ConfigClient, ServiceWarning

    if server:
        return ConfigClient(server, token=os.environ.get(ENV_TOKEN) or None)
    try:
        return ConfigClient.from_env()
    except Exception as exc:  # a JointtuneError naming what is allowed, or anything else making the client
        why = str(exc).removeprefix("base_url: ") if isinstance(exc, JointtuneError) else f"{type(exc).__name__}: {exc}"
        warn_once(
            f"server-env:{os.environ.get(ENV_SERVER, '')}",
            f"{ENV_SERVER}: {why}; not using the config service in this process (falling back: local store, "
            "then the miss policy)",
            ServiceWarning,
        )
        return None


def reset_warnings() -> None:
    """Warn again about causes already reported (tests, long-lived services after a fix)."""
    _WARNED.clear()


@dataclass(frozen=True)
class Identity:
    """Everything of a record key but the shape (`key(shape)` completes it: the `jointtune.db.RecordKey` every
    lookup of the call asks with), and the versions a record made here carries. Kept apart from RecordKey, which
    loads the store's schema, so that importing the decorator stays cheap."""

    kernel: str
    kernel_version: str
    space_version: str
    dtype: str
    world_size: int
    hardware_id: str
    triton_version: str
    #: the timing policy records must have been measured under (see `policies`)
    timing: str = "gpu"

    def key(self, shape: Mapping[str, int], **changes: Any) -> Any:
        """The record key of this call at `shape` (with `changes`: `kernel_version=None` for any version)."""
        from jointtune.db import RecordKey

        return RecordKey.of(self, shape=dict(shape), **changes)


@dataclass(frozen=True)
class Found:
    """A config and where it came from (`source`: store, service, nearest-store, default, ...)."""

    config: dict[str, Any]
    source: str
    distance: float = 0.0
    latency_us: float | None = None
    detail: str = field(default="", compare=False)
    #: the timing policy of the record it came from (None: not from a record), and its place in the
    #: asked policy's fallback chain (0: the asked policy itself)
    timing: str | None = None
    fallback: int = 0

    @property
    def exact(self) -> bool:
        return self.source in ("memory", "store", "service", "tune", "benchmark")

    def of_timing(self, timing: str, fallback: int) -> Found:
        return Found(self.config, self.source, self.distance, self.latency_us, self.detail, timing, fallback)

    def source_for(self, asked: str) -> str:
        """`source`, naming the record's policy when it stands in for the `asked` one (an interp record is what the
        CPU interpreter measures for any policy: named, not a fallback)."""
        if self.timing is None or self.timing == asked:
            return self.source
        if self.timing == INTERP:
            return f"{self.source} [interp record]"
        return f"{self.source} [{self.timing} record, fallback for {asked}]"


class _TimedOut(Exception):
    pass


def bounded(fn: Callable[[], T], timeout_s: float) -> T:
    """Run `fn` in a daemon thread and wait at most `timeout_s`; raise _TimedOut after that.

    A lookup stuck on a database lock must not stall the training step: the thread is left to
    finish on its own (it holds no lock of ours).
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="jointtune-lookup", daemon=True).start()
    if not done.wait(timeout_s):
        raise _TimedOut
    if "error" in box:
        raise box["error"]
    return box["value"]


class Sources:
    """The local store (opened lazily, bounded in time) and the service client of one process."""

    def __init__(
        self,
        *,
        db_url: str | None,
        client: ConfigClient | None,
        store_timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
        use_store: bool = True,
    ) -> None:
        self.db_url = db_url
        self.client = client
        self.store_timeout_s = check_store_timeout(store_timeout_s)
        self._store: Store | None = None
        self._store_broken = not use_store

    def retry_store(self) -> None:
        """Use the store again after a failure (the tuner just wrote to it)."""
        self._store_broken = False

    # ---- store --------------------------------------------------------------------------------
    def _with_store(self, action: str, fn: Callable[[Store], T]) -> T | None:
        """`fn(store)`, or None (with one warning) when the store is unusable; then it stays off."""
        if self._store_broken:
            return None

        def run() -> T:
            from jointtune.db import open_store

            if self._store is None:
                self._store = open_store(self.db_url)
            return fn(self._store)

        try:
            return bounded(run, self.store_timeout_s)
        except _TimedOut:
            reason = f"no answer within {self.store_timeout_s:g} s (locked?)"
        except (StoreError, JointtuneError) as exc:
            reason = str(exc)
        except Exception as exc:  # a store problem must never break the caller
            reason = f"{type(exc).__name__}: {exc}"
        self._store_broken = True
        warn_once(f"store:{self.db_url}", f"local store {self.db_url or 'default'}: {action} failed: {reason}; "
                  "skipping the local store in this process")  # fmt: skip
        return None

    def store_record(self, ident: Identity, shape: Mapping[str, int]) -> Any:
        """The stored best record of this key (what a tuned miss publishes), or None; bounded and warned about like
        every store operation."""
        return self._with_store("read", lambda store: store.best(ident.key(shape)))

    def store_exact(self, ident: Identity, shape: Mapping[str, int], accept: Accept) -> Found | None:
        def query(store: Store) -> Any:
            best = store.best(ident.key(shape))
            other = None
            if best is None:  # is there one for this exact key under another kernel version?
                near = store.nearest(ident.key(shape, kernel_version=None), limit=1)
                other = near[0][0] if near and near[0][1] == 0 else None
            return best, other

        answer = self._with_store("lookup", query)
        if answer is None:
            return None
        best, other = answer
        if best is None:
            if other is not None:
                warn_once(
                    f"version:{ident.kernel}:{other.kernel_version}",
                    f"{ident.kernel}: the local store has a record for {other.shape_key} from kernel_version "
                    f"{other.kernel_version!r}, but the kernel source is now {ident.kernel_version!r}; "
                    "ignoring it (treated as a miss)",
                )
            return None
        return _usable(ident, best.config, best.triton_version, "store", accept, best.latency_p50_us)

    def store_nearest(self, ident: Identity, shape: Mapping[str, int], accept: Accept) -> Found | None:
        rows = self._with_store("nearest lookup", lambda s: s.nearest(ident.key(shape), limit=8))
        for record, distance in rows or ():
            found = _usable(ident, record.config, record.triton_version, "nearest-store", accept,
                            record.latency_p50_us, distance=distance, quiet=True)  # fmt: skip
            if found is not None:
                return Found(found.config, found.source, distance, found.latency_us, detail=record.shape_key)
        return None

    def save(self, record: NewRecord) -> bool:
        """Keep a result in the local store (the store keeps the faster of old and new)."""
        return self._with_store("saving a record", lambda s: s.upsert_record(record)) is not None

    # ---- service ------------------------------------------------------------------------------
    def service(self, ident: Identity, shape: Mapping[str, int], accept: Accept) -> tuple[Found | None, Found | None]:
        """(exact answer, nearest answer) of the service; both None when it can't help."""
        if self.client is None:
            return None, None
        answer = self.client.find(ident.key(shape))
        if answer is None:
            return None, None
        if answer.timing != ident.timing:  # an older service answers without filtering by policy (gpu records)
            return None, None
        triton, latency = answer.provenance.triton_version, answer.latency_us.p50
        if answer.match == "exact":
            return _usable(ident, answer.config, triton, "service", accept, latency), None
        near = _usable(ident, answer.config, triton, "nearest-service", accept, latency, distance=answer.distance,
                       quiet=True)  # fmt: skip
        return None, near

    def publish(self, record: NewRecord) -> None:
        """Send a result to the service; a refusal or outage is a warning, never an error.

        Waits for it at most the client's lookup deadline (`timeout`): a slow or silent service can't hold
        the caller longer; the publish then goes on in a daemon thread (its attempts bounded by the
        client's `publish_timeout` and `retries`), which `wait_for_publishes` and the end of the process
        (at most PUBLISH_EXIT_WAIT_S) wait for."""
        client = self.client
        if client is None:
            return
        cause = f"publish:{client.base_url}"
        try:
            body = record.to_json()
        except Exception as exc:  # nothing may raise into the caller's call
            warn_once(cause, f"publishing to the config service failed: {type(exc).__name__}: {exc}")
            return

        def send() -> None:
            try:
                client.publish(body)
            except Exception as exc:
                why = str(exc) if isinstance(exc, JointtuneError) else f"{type(exc).__name__}: {exc}"
                warn_once(cause, f"publishing to the config service failed: {why}")
            finally:
                with _PUBLISHING_LOCK:
                    _PUBLISHING.discard(thread)

        thread = threading.Thread(target=send, name="jointtune-publish", daemon=True)
        with _PUBLISHING_LOCK:
            _PUBLISHING.add(thread)
        thread.start()
        thread.join(client.timeout)


_PUBLISHING: set[threading.Thread] = set()
_PUBLISHING_LOCK = threading.Lock()


def wait_for_publishes(timeout_s: float | None = None) -> bool:
    """Wait for the publishes still under way in the background (at most `timeout_s` in all; None: until
    they end). True when none is left."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        with _PUBLISHING_LOCK:
            pending = next(iter(_PUBLISHING), None)
        if pending is None:
            return True
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            return False
        pending.join(left)


atexit.register(wait_for_publishes, PUBLISH_EXIT_WAIT_S)


def _usable(
    ident: Identity,
    config: Mapping[str, Any],
    triton: str,
    source: str,
    accept: Accept,
    latency: float | None,
    *,
    distance: float = 0.0,
    quiet: bool = False,
) -> Found | None:
    if triton != ident.triton_version:
        if not quiet:
            warn_once(
                f"triton:{ident.kernel}:{source}:{triton}",
                f"{ident.kernel}: a {source} record was tuned with Triton {triton}, this is Triton "
                f"{ident.triton_version}; ignoring it (treated as a miss)",
            )
        return None
    reason = accept(config)
    if reason is not None:
        if not quiet:
            warn_once(
                f"reject:{ident.kernel}:{source}:{sorted(config.items())!r}",
                f"{ident.kernel}: the {source} config {dict(config)} can't be used here ({reason}); treated as a miss",
            )
        return None
    return Found(dict(config), source, distance, latency)
