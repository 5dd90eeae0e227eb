"""A Deployment's rolling update, as the Kubernetes deployment controller steps it: new pods
up to replicas + maxSurge, old pods taken down while at least replicas - maxUnavailable are
available (a pod still starting is not available). Pure: counts in, counts out."""

from __future__ import annotations


def step(replicas: int, surge: int, unavailable: int, new_total: int, new_ready: int,
         old_live: int) -> tuple[int, int]:
    """(pods to create, old pods to delete) now; terminating pods are not counted, as in
    Kubernetes' ``maxSurge`` accounting."""
    total = new_total + old_live
    create = max(0, min(replicas - new_total, replicas + surge - total))
    kill = max(0, min(old_live, total - (replicas - unavailable) - (new_total - new_ready)))
    return create, kill
