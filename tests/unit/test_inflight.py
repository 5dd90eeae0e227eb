"""A worker's ledger in a page shared with its main process: after the worker dies, the page
says exactly what it had in flight."""

from __future__ import annotations

import os

from lameduck.drain.ledger import Ledger
from lameduck.server.inflight import InFlight


def test_the_main_process_reads_what_the_worker_counts() -> None:
    main = InFlight()  # made by the main process
    worker = InFlight(os.dup(main.fd))  # mapped by the worker from the descriptor passed
    try:
        ledger = Ledger()
        ledger.completed = 7
        ledger.accepted()  # a connection accepted before the page was shared
        ledger.share(worker.slots)
        assert ledger.completed == 7 and ledger.accepting and main.lost() == 1
        ledger.accepted()  # two connections accepted, nothing read
        assert ledger.begin()  # a third connection's request
        ledger.heard()  # a fresh one's first request begins
        assert ledger.begin()
        assert (ledger.active, ledger.fresh) == (2, 1)
        assert main.lost() == 3
        ledger.end()
        ledger.abandon()
        ledger.accepting = False
        assert not ledger.begin() and ledger.refused == 1  # counted, then taken back out
        assert main.lost() == 1 and ledger.idle
    finally:
        worker.close()
        main.close()
