"""The process log's text lines carry the pid (a hot restart writes two processes into one
log for a while), as its JSON records do."""

from __future__ import annotations

import logging
import os
import re

from lameduck.server.logfile import TEXT_FORMAT, IsoFormatter


def test_text_lines_carry_the_pid() -> None:
    record = logging.LogRecord("lameduck", logging.INFO, __file__, 1, "listener %s", ("a",),
                               None)
    line = IsoFormatter(TEXT_FORMAT).format(record)
    assert re.fullmatch(rf"\S+ \[{os.getpid()}\] INFO lameduck: listener a", line), line
