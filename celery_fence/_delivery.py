"""One delivery of a fenced task: the key its run takes, what its message's headers say, what recovery needs
to send it again, and how it ends.

**The key** (:func:`derive_key`): a ``fence_key`` message header, else the task's ``fence_key`` option (a
format string over the bound arguments, or a callable), else the task id.

**The headers** a run reads from its message (:class:`Attempt`) and puts on the copies of itself that it
sends. Each carries what one attempt learned for the next delivery of the same message: a copy sent by a run
cannot ask that run, and the store cannot tell a copy's attempts apart. Two kinds, kept apart:

- the **lineage** (``LINEAGE``): what every later copy of the task id must know, whoever sends it (the token
  handed over, how many times the fence sent the run again);
- the **attempt** (``ATTEMPT``): the clock and count of one wait before a run acquires (an outage waited
  out, a busy key polled). Only the wait that set them carries them on; every other copy, Celery's own
  ``retry`` included, is sent without them, so a later wait starts its own clock.

**The run info** (:func:`run_info`), recorded with the lease at acquire. Recovery must re-send the *same*
message, not just the same call: a chain's next tasks, a chord's body and a group's bookkeeping travel in the
message (``chain``, ``link``, ``chord``, ``group``...), and a message routed through an exchange by a routing
key that differs from its queue's name must come back to that queue. So the record holds the task's name, id
and arguments, the execution options Celery itself re-sends on a retry (``Context.as_execution_options``),
and the route: exchange, routing key, priority, and the queue the message came on when this process can tell
it (a queue it consumes bound to that exchange and key). An ``eta`` is not kept (the run already started: its
copy is due at once); ``expires`` is, so a copy of an expired message is revoked as the original would have
been.

**The ending** (:class:`Ending`), what the run decided and the task carries out. The run never raises
Celery's control-flow exceptions itself nor sends a message: it returns an ending, and the task performs it,
in this order: send the copy (if any), give back the lease it hands over, write the record the store is owed
(a give-up record: :class:`Stranded`), store a FAILURE the caller must see, then return the value or raise.
That keeps every decision in the table and the Celery glue to one small place. Whether the task id already
ended is the result backend's word (:data:`ENDED_STATES`).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import inspect
import re
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from . import codec
from .errors import ConfigurationError, FenceError, NotSerializable
from .lease import Lease, validate_key

__all__ = [
    "ATTEMPT",
    "AWAITED",
    "BUSY_SINCE",
    "ENDED_STATES",
    "FAILED_STATES",
    "HANDOFF",
    "LINEAGE",
    "LOOKS",
    "RECOVERED",
    "RESENDS",
    "WAITING_SINCE",
    "WAITS",
    "Attempt",
    "Ending",
    "Kind",
    "Stranded",
    "attempt_of",
    "check_key_template",
    "derive_key",
    "key_spec",
    "lineage",
    "non_negative_int",
    "positive_int",
    "resend_options",
    "run_info",
    "run_name",
    "seconds",
]

# -- the key --


def key_spec(task: Any) -> Any:
    """The task's ``fence_key`` as written: ``None``, a format string or a callable.

    Celery makes decorator options class attributes, so a plain function would come back bound to the
    task: read the attribute as stored, and unwrap a staticmethod.
    """
    spec = inspect.getattr_static(task, "fence_key", None)
    return spec.__func__ if isinstance(spec, staticmethod) else spec


def derive_key(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, bool]:
    """The run's key, and whether it is the task id (so any holder of it is a copy of this very task)."""
    header = getattr(task.request, "fence_key", None)
    if header is not None:
        return validate_key(header), False
    spec = key_spec(task)
    if spec is None:
        return validate_key(task.request.id), True
    if callable(spec):
        return validate_key(spec(*args, **kwargs)), False
    if not isinstance(spec, str):
        raise ConfigurationError(
            f"{task.name}: fence_key must be a format string or a callable, not {spec!r}"
        )
    try:
        bound = inspect.signature(task.run).bind(*args, **kwargs)
        bound.apply_defaults()
        key = spec.format(**bound.arguments)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{task.name}: fence_key {spec!r} does not fit the task's arguments ({exc!r}); "
            "name the task's parameters in braces, e.g. 'invoice:{invoice_id}'"
        ) from exc
    return validate_key(key), False


def check_key_template(task: Any) -> None:
    """Refuse a ``fence_key`` format string naming a field the task's signature cannot fill (the worker's
    startup check: otherwise it shows only when the task runs). A callable is the user's to get right."""
    spec = key_spec(task)
    if spec is None or callable(spec):
        return
    if not isinstance(spec, str):
        raise ConfigurationError(
            f"task {task.name}: fence_key must be a format string or a callable, not {spec!r}"
        )
    parameters = list(inspect.signature(task.run).parameters)
    try:
        fields = list(_fields(spec))
    except ValueError as exc:  # unbalanced braces, say
        raise ConfigurationError(
            f"task {task.name}: fence_key {spec!r} is not a format string: {exc}"
        ) from exc
    for field in fields:
        name = re.split(r"[.\[]", field, maxsplit=1)[0]  # {order.id} and {items[0]} name order, items
        if name not in parameters:
            raise ConfigurationError(_unfit(task.name, spec, name, parameters))


def _fields(template: str) -> Iterator[str]:
    """Every replacement field of ``template``, also those nested in a format spec (``{n:{width}}``)."""
    for _, field, format_spec, _ in string.Formatter().parse(template):
        if field is not None:
            yield field
        if format_spec:
            yield from _fields(format_spec)


def _unfit(task_name: str, spec: str, name: str, parameters: list[str]) -> str:
    if not name or name.isdigit():  # the key is filled from the arguments by name: no position to fill
        what = "a positional field {" + name + "}"
    else:
        close = difflib.get_close_matches(name, parameters, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        what = f"{{{name}}}, which is not a parameter of the task{hint}"
    return (
        f"task {task_name}: fence_key {spec!r} names {what}; its parameters are "
        f"{', '.join(parameters) or 'none'}: name one of them in braces, e.g. 'invoice:{{invoice_id}}'"
    )


# -- the headers --

HANDOFF = "fence_handoff"  # the token an attempt hands to the copy of itself that it sends
RESENDS = "fence_resends"  # how many times the fence sent this task id again after a run (fence_max_resends)
WAITING_SINCE = "fence_waiting_since"  # when a run first found the store unavailable (epoch s)
WAITS = "fence_waits"  # how many times it was sent again to wait the store out
BUSY_SINCE = "fence_busy_since"  # when a run first found its key held by another task id (epoch s)
LOOKS = "fence_looks"  # how many times a copy was sent again to look at a held key
AWAITED = "fence_awaited"  # the token of a finished key whose ending a copy already waited to see stored
RECOVERED = "fence_recovered"  # recovery's attempt number, on the message it sent again

LINEAGE = (HANDOFF, RESENDS)
ATTEMPT = (WAITING_SINCE, WAITS, BUSY_SINCE, LOOKS, AWAITED, RECOVERED)


@dataclass(frozen=True)
class Attempt:
    """What one delivery of a fenced task knows of itself: its message, as the run reads it."""

    task_id: str
    name: str = ""  # the task's name
    eager: bool = False
    retries: int = 0
    handoff: int | None = None
    resends: int = 0
    waiting_since: float | None = None
    waits: int = 0
    busy_since: float | None = None
    looks: int = 0
    awaited_token: int | None = None  # the token of a finished key whose ending a copy already waited for
    redelivered: bool = False  # the broker says it delivered this message before
    recovered: int | None = None  # recovery sent this message again (its attempt)

    @property
    def copy(self) -> bool:
        """A copy of an earlier delivery: redelivered by the broker, sent again by the fence or recovery."""
        sent_again = (self.recovered, self.handoff, self.resends, self.waits, self.looks)
        awaited = self.awaited_token is not None  # a token, 0 for a key marked failed that never had one
        return self.redelivered or awaited or any(sent_again) or bool(self.busy_since)


def attempt_of(request: Any, name: str) -> Attempt:
    """The :class:`Attempt` of the message ``request`` of task ``name`` runs."""
    return Attempt(
        task_id=request.id,
        name=name,
        eager=bool(request.is_eager),
        retries=request.retries or 0,
        handoff=positive_int(request, HANDOFF),
        resends=positive_int(request, RESENDS) or 0,
        waiting_since=seconds(request, WAITING_SINCE),
        waits=positive_int(request, WAITS) or 0,
        busy_since=seconds(request, BUSY_SINCE),
        looks=positive_int(request, LOOKS) or 0,
        awaited_token=non_negative_int(getattr(request, AWAITED, None)),
        redelivered=bool((request.delivery_info or {}).get("redelivered")),
        recovered=positive_int(request, RECOVERED),
    )


def run_name(attempt: Attempt) -> str:
    """``name[task id]``, as Celery's own log lines name a run."""
    return f"{attempt.name}[{attempt.task_id}]"


def lineage(headers: dict[str, Any] | None) -> dict[str, Any]:
    """``headers`` without the attempt's own (what every copy inherits)."""
    return {name: value for name, value in (headers or {}).items() if name not in ATTEMPT}


def non_negative_int(value: Any) -> int | None:
    """``value`` if it is an int >= 0 (a header holding a token, which is 0 for a key never leased)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def positive_int(request: Any, header: str) -> int | None:
    """``header`` of the message ``request`` runs, if it is a positive int (a token or a count)."""
    value = getattr(request, header, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def seconds(request: Any, header: str) -> float | None:
    """``header`` of the message ``request`` runs, if it is a positive number (a time)."""
    value = getattr(request, header, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


# -- the run info --

# Execution options that are the sender's or the worker's, not the message's: a re-send sets its own.
_NOT_KEPT = ("task_id", "origin")


def run_info(task: Any, request: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> codec.Encoded:
    """The run's record, encoded once here (the store keeps this text instead of encoding it again).

    Arguments and options that JSON cannot carry are left out (``args`` is then ``None``): the run still
    runs, but recovery cannot send it again and says so.
    """
    info: dict[str, Any] = {"task": task.name, "id": request.id, "args": list(args), "kwargs": dict(kwargs)}
    if getattr(request, "fence_key", None) is not None:
        info["fence_key"] = request.fence_key
    sent = request.as_execution_options().items()
    options = {k: v for k, v in sent if v is not None and k not in _NOT_KEPT}
    if not options.get("headers"):
        options.pop("headers", None)
    options.update(_route(task.app, request.delivery_info or {}))
    info["options"] = options
    try:
        return codec.Encoded(info)
    except NotSerializable as exc:
        info.update(args=None, kwargs=None, options=None, dropped=str(exc))
        return codec.Encoded(info)


def _route(app: Any, delivery: Mapping[str, Any]) -> dict[str, Any]:
    """Exchange, routing key, priority, and the queue the message came on when it can be told."""
    route = {k: delivery[k] for k in ("exchange", "routing_key", "priority") if delivery.get(k) is not None}
    queue = _queue_of(app, route.get("exchange"), route.get("routing_key"))
    if queue is not None:
        route["queue"] = queue
    return route


def _queue_of(app: Any, exchange: str | None, routing_key: str | None) -> str | None:
    """The queue bound to ``exchange`` by ``routing_key``, preferring the ones this worker consumes."""
    if not routing_key:
        return None
    if not exchange:  # the default (anonymous) exchange routes by queue name
        return routing_key
    queues = app.amqp.queues
    for candidates in (queues.consume_from or {}, queues):
        found = [
            name
            for name, queue in dict(candidates).items()
            if queue.exchange is not None
            and queue.exchange.name == exchange
            and queue.routing_key == routing_key
        ]
        if len(found) == 1:
            return str(found[0])
    return None


def resend_options(run: Mapping[str, Any]) -> dict[str, Any]:
    """``send_task`` options that send the recorded message again: same id, options and route.

    Records written before the options were kept carry a ``queue`` only: sent there, as then.
    """
    options = dict(run.get("options") or {})
    if not run.get("options") and run.get("queue"):
        options["queue"] = run["queue"]
    if run.get("fence_key") is not None:
        options["headers"] = {**(options.get("headers") or {}), "fence_key": run["fence_key"]}
    return {"args": run["args"], "kwargs": run["kwargs"], "task_id": run["id"], **options}


# -- the ending --

FAILED_STATES = frozenset({"FAILURE", "REVOKED"})  # a task id Celery reported ended without success
ENDED_STATES = FAILED_STATES | {"SUCCESS"}  # a task id whose ending Celery delivered: a copy adds nothing


class Kind(enum.Enum):
    RETURN = "return"  # the task returns ``value`` (Celery stores SUCCESS)
    IGNORE = "ignore"  # the task ends with Ignore: nothing stored for it by this run
    RAISE = "raise"  # the task raises ``error`` (Celery's course: FAILURE, Retry, Reject, ...)
    SEND_AGAIN = "send again"  # a copy of the message (same id, same retries) is sent, then Ignore or Retry


@dataclass(frozen=True)
class Ending:
    """How a run ends, as the task carries it out (:class:`Kind`, and what that kind needs)."""

    kind: Kind
    value: Any = None
    error: BaseException | None = None  # RAISE: what is raised; SEND_AGAIN: shown as RETRY (Retry(exc=...))
    countdown: float = 0.0  # SEND_AGAIN: seconds before the copy runs
    # SEND_AGAIN: the copy's own fence headers
    headers: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    hand_back: Lease | None = None  # released once the copy is sent (or at once, when nothing is sent)
    record: Stranded | None = None  # a give-up record the store is owed
    failure: FenceError | None = None  # IGNORE: stored as the task id's FAILURE first (ends ready)

    @classmethod
    def returning(cls, value: Any) -> Ending:
        return cls(Kind.RETURN, value=value)

    @classmethod
    def ignoring(
        cls,
        hand_back: Lease | None = None,
        failure: FenceError | None = None,
        record: Stranded | None = None,
    ) -> Ending:
        return cls(Kind.IGNORE, hand_back=hand_back, failure=failure, record=record)

    @classmethod
    def raising(
        cls, error: BaseException, hand_back: Lease | None = None, record: Stranded | None = None
    ) -> Ending:
        return cls(Kind.RAISE, error=error, hand_back=hand_back, record=record)

    @classmethod
    def sending_again(
        cls,
        countdown: float,
        headers: Mapping[str, Any],
        hand_back: Lease | None = None,
        shown_as_retry: BaseException | None = None,
    ) -> Ending:
        return cls(
            Kind.SEND_AGAIN, countdown=countdown, headers=headers, hand_back=hand_back, error=shown_as_retry
        )


@dataclass(frozen=True)
class Stranded:
    """The record of one run the fence gave up on: ``Store.strand(key, run, reason)``."""

    task_id: str
    key: str
    run: Mapping[str, Any] | None
    reason: str
