"""The ``fence_*`` settings, read from a Celery app's configuration and checked once."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError, InvalidArgument
from .lease import LeasePolicy
from .stores import DEFAULT_STORE_URL, scheme_of

__all__ = [
    "BUSY_POLICIES",
    "DEFAULTS",
    "MODES",
    "TASK_OPTIONS",
    "FenceConfig",
    "check_prune_age",
    "metrics_port",
    "prune_min_age",
]

BUSY_POLICIES = ("retry", "ignore", "fail")
# "lease": a lease renewed while the body runs, every write fenced by its token. "commit": no lease; the
# completion claims the key inside the run's transaction, with its COMMIT (docs/commit-mode.md).
MODES = ("lease", "commit")
MAX_PORT = 65535
MAX_SECONDS = 1e9  # the longest duration a setting may name (the stores cap ttls and ages there too)
REDELIVERY_WINDOW = 3600.0  # kombu's Redis visibility_timeout; AMQP redelivers on any lost connection

DEFAULTS: dict[str, Any] = {
    "fence_store_url": DEFAULT_STORE_URL,
    "fence_lease_ttl": 30.0,
    "fence_renew_interval": None,  # ttl / 3
    "fence_on_busy": "retry",
    "fence_mode": "lease",
    "fence_interrupt": False,
    "fence_max_recoveries": 3,
    "fence_store_wait": 600.0,  # seconds a run waits out an unavailable store before its body starts
    "fence_busy_wait": 3600.0,  # seconds a run polls a key another task id holds (fence_on_busy="retry")
    "fence_max_resends": 20,  # times the fence sends one task id again after a refusal or unknown outcome
    "fence_send_events": True,
    "fence_recover": True,  # every worker takes part; one at a time runs it (`--no-fence-recover`: off)
    "fence_metrics_port": None,  # or `celery worker --fence-metrics-port`: serve Prometheus metrics
    "fence_metrics_addr": None,  # the address it listens on: 0.0.0.0
    "fence_prune_min_age": None,  # the broker's visibility_timeout if set, else REDELIVERY_WINDOW
}
# The options a fenced task may set for itself (``FencedTask``'s attributes); the rest are app-wide.
TASK_OPTIONS = ("fence_key", "fence_lease_ttl", "fence_on_busy", "fence_interrupt", "fence_mode")


def metrics_port(value: Any, name: str = "fence_metrics_port") -> int | None:
    """``fence_metrics_port`` (or the worker option ``name``): ``None`` (no metrics server) or a TCP port."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_PORT:
        raise ConfigurationError(
            f"{name} must be a TCP port (an int from 1 to 65535) or None, got {value!r}"
        )
    return value


def metrics_addr(value: Any, name: str = "fence_metrics_addr") -> str | None:
    """``fence_metrics_addr`` (or the worker option ``name``): ``None`` (all interfaces) or the host
    address the metrics server binds."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"{name} must be a host address such as '127.0.0.1' or None, got {value!r}"
        )
    return value


def prune_min_age(conf: Mapping[str, Any]) -> float:
    """The youngest finished key ``celery fence prune`` drops without ``--force``, in seconds.

    ``fence_prune_min_age``; unset, the broker's redelivery window: ``broker_transport_options``'s
    ``visibility_timeout`` (Redis, SQS) when set, else 3600 s (kombu's Redis default; an AMQP broker
    redelivers an unacknowledged message whenever a connection drops, so it has no shorter bound).
    """
    name, value = "fence_prune_min_age", conf.get("fence_prune_min_age")
    if value is None:
        name = "broker_transport_options['visibility_timeout']"
        value = (conf.get("broker_transport_options") or {}).get("visibility_timeout", REDELIVERY_WINDOW)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ConfigurationError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def check_prune_age(conf: Mapping[str, Any], older_than: float, force: bool = False) -> float:
    """The prune floor (:func:`prune_min_age`); ``InvalidArgument`` naming ``--force`` when ``older_than``
    is below it and not forced: a message the broker redelivers after the prune would run the key again."""
    floor = prune_min_age(conf)
    if older_than < floor and not force:
        raise InvalidArgument(
            f"refusing to prune keys finished less than fence_prune_min_age ({floor:g}s) ago: the broker may "
            "still redeliver their messages, and a redelivered message of a pruned key runs the task again. "
            f"Use --older-than {floor:g}s or more, or --force"
        )
    return floor


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} must be an int >= 0, got {value!r}")
    return value


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < MAX_SECONDS:
        raise ConfigurationError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class FenceConfig:
    store_url: str
    policy: LeasePolicy
    on_busy: str
    interrupt: bool
    max_recoveries: int
    send_events: bool
    store_wait: float = 600.0
    busy_wait: float = 3600.0
    max_resends: int = 20
    mode: str = "lease"

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> FenceConfig:
        """Read ``fence_*`` settings (unset ones take :data:`DEFAULTS`); refuse what cannot work."""

        def get(name: str) -> Any:
            value = conf.get(name)
            return DEFAULTS[name] if value is None else value

        url = get("fence_store_url")
        scheme_of(url)  # refuses a malformed URL now, not at the first task
        on_busy = get("fence_on_busy")
        if on_busy not in BUSY_POLICIES:
            raise ConfigurationError(f"fence_on_busy must be one of {BUSY_POLICIES}, got {on_busy!r}")
        max_recoveries = _count("fence_max_recoveries", get("fence_max_recoveries"))
        max_resends = _count("fence_max_resends", get("fence_max_resends"))
        policy = LeasePolicy(get("fence_lease_ttl"), get("fence_renew_interval"))
        metrics_port(conf.get("fence_metrics_port"))  # refused at worker start, not at the first scrape
        metrics_addr(conf.get("fence_metrics_addr"))
        prune_min_age(conf)
        store_wait = _seconds("fence_store_wait", get("fence_store_wait"))
        busy_wait = _seconds("fence_busy_wait", get("fence_busy_wait"))
        interrupt, send_events = bool(get("fence_interrupt")), bool(get("fence_send_events"))
        mode = get("fence_mode")
        if mode not in MODES:
            raise ConfigurationError(
                f"fence_mode must be one of {MODES}, got {mode!r}: 'lease' (the default) fences every run "
                "with a lease; 'commit' fences only the commit of a task whose whole effect is SQL writes "
                "in the store's database"
            )
        return cls(
            url, policy, on_busy, interrupt, max_recoveries, send_events, store_wait, busy_wait, max_resends,
            mode,
        )

    def with_task_options(
        self, ttl: float | None, on_busy: str | None, interrupt: bool | None, mode: str | None = None
    ) -> FenceConfig:
        """Apply a task's own ``fence_lease_ttl``/``fence_on_busy``/``fence_interrupt``/``fence_mode`` over
        the app's."""
        if ttl is None and on_busy is None and interrupt is None and mode is None:
            return self
        conf = {
            "fence_store_url": self.store_url,
            "fence_lease_ttl": self.policy.ttl if ttl is None else ttl,
            "fence_renew_interval": None if ttl is not None else self.policy.renew_interval,
            "fence_on_busy": self.on_busy if on_busy is None else on_busy,
            "fence_interrupt": self.interrupt if interrupt is None else interrupt,
            "fence_max_recoveries": self.max_recoveries,
            "fence_send_events": self.send_events,
            "fence_store_wait": self.store_wait,
            "fence_busy_wait": self.busy_wait,
            "fence_max_resends": self.max_resends,
            "fence_mode": self.mode if mode is None else mode,
        }
        return FenceConfig.from_conf(conf)
