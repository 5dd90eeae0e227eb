"""`lameduck budget --lb PRESET`: a load balancer's documented defaults, with their sources.

`lameduck budget` needs the balancer's detection time (health-check interval x failures before
it takes a backend out) and, for balancers that drain a deregistered backend, how long they
keep its connections (the deregistration delay). Typing them in by hand is where mistakes
come from, so the common balancers' defaults are here, each value with the vendor page that
states it (docs/budget.md, "Balancer presets", has the same table). Explicit `--lb-*` flags
override a preset's values: a preset is the balancer as shipped, not as configured.

A value a vendor does not document is None, never a guess: Envoy's health check has no
default interval (`interval` and `unhealthy_threshold` are REQUIRED in its API), so
`--lb envoy` needs `--lb-interval`; kube-proxy has no health check and Kubernetes gives no
bound on how fast a removed endpoint reaches every node, so that time is the LB buffer's.

Pure: values in, values out; the CLI prints what `deregistration_warning` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from lameduck.orchestrate.budget import BudgetError


@dataclass(frozen=True, slots=True)
class LbPreset:
    """One balancer's defaults. None: the vendor documents no default (it must be given)."""

    name: str
    title: str
    interval: float | None  # seconds between health checks
    fall: int | None  # failed checks before the backend is taken out
    rise: int | None  # good checks before a backend is put back (reported only)
    deregistration_delay: float | None  # how long it drains a removed backend; None: no delay
    notes: tuple[str, ...]  # what the numbers mean for a drain, with their caveats
    sources: tuple[str, ...]  # the vendor pages stating each value

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "title": self.title, "interval": self.interval,
                "fall": self.fall, "rise": self.rise,
                "deregistration_delay": self.deregistration_delay,
                "notes": list(self.notes), "sources": list(self.sources)}


_AWS_CREATE_TG: Final = ("https://docs.aws.amazon.com/elasticloadbalancing/latest/APIReference/"
                         "API_CreateTargetGroup.html")
_AWS_TG_ATTRS: Final = ("https://docs.aws.amazon.com/elasticloadbalancing/latest/APIReference/"
                        "API_TargetGroupAttribute.html")

LB_PRESETS: Final[dict[str, LbPreset]] = {p.name: p for p in (
    # HAProxy configuration manual, server options: "inter ... If left unspecified, the delay
    # defaults to 2000 ms"; "fall ... This value defaults to 3 if unspecified"; "rise ... This
    # value defaults to 2 if unspecified". A DOWN server's established sessions are kept
    # (unless `on-marked-down shutdown-sessions`): no deregistration delay of its own.
    LbPreset(
        "haproxy", "HAProxy server `check` defaults (inter 2s, fall 3, rise 2)",
        interval=2.0, fall=3, rise=2, deregistration_delay=None,
        notes=("an HTTP check (`option httpchk`) counts lameduck's 503 as a failed check: "
               "out after `fall` of them",),
        sources=("https://docs.haproxy.org/3.0/configuration.html#5.2-inter",
                 "https://docs.haproxy.org/3.0/configuration.html#5.2-fall",
                 "https://docs.haproxy.org/3.0/configuration.html#5.2-rise")),
    # Envoy's config.core.v3.HealthCheck: `interval` (REQUIRED) and `unhealthy_threshold`
    # (REQUIRED) have no default. For HTTP checks "if a host responds with a code not in
    # expected_statuses or retriable_statuses, this threshold is ignored and the host is
    # considered immediately unhealthy": lameduck's 503 is one failed check, so fall is 1.
    LbPreset(
        "envoy", "Envoy active HTTP health checking (no default interval: give --lb-interval)",
        interval=None, fall=1, rise=None, deregistration_delay=None,
        notes=("Envoy's HealthCheck has no default interval or thresholds (both REQUIRED): "
               "--lb-interval is yours",
               "an HTTP check's non-expected status (lameduck's 503) marks the host unhealthy "
               "at once, ignoring unhealthy_threshold: fall 1; a TCP check or a timeout counts "
               "against unhealthy_threshold: pass --lb-fall"),
        sources=("https://www.envoyproxy.io/docs/envoy/latest/api-v3/config/core/v3/"
                 "health_check.proto",
                 "https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/"
                 "health_checking")),
    # Elastic Load Balancing API, CreateTargetGroup: HealthCheckIntervalSeconds "If the target
    # group protocol is TCP, TLS, UDP, TCP_UDP, HTTP or HTTPS, the default is 30 seconds";
    # UnhealthyThresholdCount: "the default is 2"; HealthyThresholdCount: "the default is 5".
    # TargetGroupAttribute: deregistration_delay.timeout_seconds "The default value is 300
    # seconds".
    LbPreset(
        "aws-alb", "AWS Application Load Balancer target group defaults",
        interval=30.0, fall=2, rise=5, deregistration_delay=300.0,
        notes=("the ALB stops sending new requests to a deregistering target and waits up to "
               "deregistration_delay.timeout_seconds (300 s) for its in-flight requests",),
        sources=(_AWS_CREATE_TG, _AWS_TG_ATTRS,
                 "https://docs.aws.amazon.com/elasticloadbalancing/latest/application/"
                 "target-group-health-checks.html")),
    # The same CreateTargetGroup defaults for a TCP/TLS target group (30 s, 2 failures; older
    # API versions allowed only 10 or 30 s for TCP checks); the same 300 s deregistration delay;
    # deregistration_delay.connection_termination.enabled: "For new UDP/TCP_UDP target groups
    # the default is true. Otherwise, the default is false."
    LbPreset(
        "aws-nlb", "AWS Network Load Balancer target group defaults",
        interval=30.0, fall=2, rise=5, deregistration_delay=300.0,
        notes=("deregistration_delay.connection_termination.enabled is false by default (TCP, "
               "TLS): the NLB does not close the connections it still tracks when the 300 s "
               "delay ends; set it true for the NLB to close them then",
               "an NLB resets connections to a target once it is unhealthy "
               "(target_health_state.unhealthy.connection_termination.enabled, default true): "
               "failing the health check before the drain has finished cuts keep-alive "
               "connections"),
        sources=(_AWS_CREATE_TG, _AWS_TG_ATTRS,
                 "https://docs.aws.amazon.com/elasticloadbalancing/latest/network/"
                 "target-group-health-checks.html",
                 "https://docs.aws.amazon.com/elasticloadbalancing/latest/network/"
                 "edit-target-group-attributes.html")),
    # Kubernetes' Pod termination: "At the same time as the kubelet is starting graceful
    # shutdown of the Pod, the control plane evaluates whether to remove that shutting-down Pod
    # from EndpointSlice objects"; kube-proxy then reprograms each node. No health check and no
    # documented bound on that propagation.
    LbPreset(
        "kube-proxy", "a Service's kube-proxy (EndpointSlice removal, no health check)",
        interval=0.0, fall=1, rise=None, deregistration_delay=None,
        notes=("kube-proxy does not health-check: the pod leaves the EndpointSlices when its "
               "deletion starts (t=0); Kubernetes documents no bound on how long every node's "
               "kube-proxy takes to learn it, so budget counts detection as 0 s and assumes "
               "the propagation fits in --lb-buffer (raise it on a large or busy cluster)",),
        sources=("https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/"
                 "#pod-termination",
                 "https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/"
                 "#conditions")),
)}


def lb_settings(preset: str | None, *, interval: float | None = None,
                fall: int | None = None, rise: int | None = None,
                deregistration_delay: float | None = None
                ) -> tuple[dict[str, float | int], float | None]:
    """Budget's lb_interval/lb_fall/lb_rise, and the deregistration delay (None: none).

    Given values win over the preset's; without a preset the defaults are HAProxy's
    (`inter 2s fall 3 rise 2`, budget's defaults before presets existed) and no delay.
    """
    p = LB_PRESETS["haproxy"] if preset is None else LB_PRESETS.get(preset)
    if p is None:
        raise BudgetError(f"--lb: {preset!r} is not one of {', '.join(LB_PRESETS)}")
    interval = p.interval if interval is None else interval
    if interval is None:
        raise BudgetError(f"--lb {p.name}: the balancer documents no default health-check "
                          "interval; pass --lb-interval")
    fall = p.fall if fall is None else fall
    if fall is None:
        raise BudgetError(f"--lb {p.name}: pass --lb-fall")
    rise = rise if rise is not None else (p.rise if p.rise is not None else 2)
    delay = p.deregistration_delay if deregistration_delay is None else deregistration_delay
    return {"lb_interval": interval, "lb_fall": fall, "lb_rise": rise}, delay


def deregistration_warning(delay: float | None, grace_period: float,
                           balancer: str = "load balancer") -> str | None:
    """A warning when the balancer drains longer than the pod lives, else None.

    The balancer keeps a deregistered pod's connections for up to the delay, counted from
    the pod's removal (at its deletion, t=0); the kubelet SIGKILLs the pod at
    terminationGracePeriodSeconds. A longer delay is not a longer drain: whatever the
    balancer still drains at the grace period is cut by the SIGKILL.
    """
    if delay is None or delay <= grace_period:
        return None
    return (f"{balancer} deregistration delay ({_secs(delay)}) outlives the pod's "
            f"terminationGracePeriodSeconds ({_secs(grace_period)}): connections the balancer "
            f"still drains after {_secs(grace_period)} are cut by the kubelet's SIGKILL; set "
            f"the delay to at most {_secs(grace_period)} or raise the grace period")


def _secs(v: float) -> str:
    return f"{int(v)}s" if v == int(v) else f"{v:g}s"
