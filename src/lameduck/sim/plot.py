"""The picture of a run (or of runs compared): reconnects per 100 ms, the busiest instance's
load and the fleet's, and failures as they add up. matplotlib, drawn to a PNG."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lameduck.sim.fleet import BIN, CAUSES, Result


def draw(results: Sequence[Result], out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rc, ax_load, ax_fail) = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True,
                                                 gridspec_kw={"height_ratios": [3, 2, 1.4]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, res in enumerate(results):
        color = colors[i % len(colors)]
        sc = res.scenario
        cfg = sc.config
        label = (f"{sc.name}: {cfg.drain.strategy.value}, T={cfg.drain.time:g}s, "
                 f"G={cfg.drain.connection_grace:g}s")
        t = np.arange(res.reconnects.size) * BIN
        ax_rc.plot(t, res.reconnects, color=color, lw=0.9, label=label,
                   alpha=0.9 if len(results) == 1 else 0.75)
        if res.sample_t.size:
            with np.errstate(all="ignore"):
                finite = np.where(np.isfinite(res.load), res.load, -np.inf)
                top = finite.max(axis=1)
            ax_load.plot(res.sample_t, 100 * top, color=color, lw=1.0,
                         label=f"{sc.name}: busiest instance")
            ax_load.plot(res.sample_t, 100 * res.fleet_load, color=color, lw=1.0, ls="--",
                         label=f"{sc.name}: fleet (offered / serving capacity)")
        total = np.cumsum(sum(res.failures[c] for c in CAUSES))
        ax_fail.plot(t, total, color=color, lw=1.2, label=f"{sc.name}: {round(total[-1])}")
        start = sc.rollout.at if sc.rollout is not None else sc.drain.at if sc.drain else None
        if start is not None and i == 0:
            for ax in (ax_rc, ax_load, ax_fail):
                ax.axvline(start, color="grey", lw=0.8, ls=":")
    ax_rc.set_ylabel("reconnects per 100 ms")
    ax_rc.set_title("Simulated: " + " vs ".join(r.scenario.name for r in results))
    ax_rc.legend(loc="upper right", fontsize=8)
    ax_load.axhline(100, color="red", lw=0.7, ls=":")
    ax_load.set_ylabel("load (% of capacity)")
    ax_load.legend(loc="upper right", fontsize=7)
    ax_fail.set_ylabel("failed requests\n(cumulative)")
    ax_fail.set_xlabel("virtual time (s)")
    ax_fail.legend(loc="upper left", fontsize=8)
    for ax in (ax_rc, ax_load, ax_fail):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
