"""Start a command the way systemd socket activation does (sd_listen_fds(3)): the listening
sockets given as inherited descriptors are moved to fd 3, 4, ...; LISTEN_FDS, LISTEN_FDNAMES
and LISTEN_PID (our own pid, which exec keeps) are set; then the command is exec'd.

    python tests/sdactivate.py [--pid-offset N] FD[=NAME] ... -- COMMAND ...

``--pid-offset`` makes LISTEN_PID wrong on purpose (the sockets are then not for us).
"""

from __future__ import annotations

import fcntl
import os
import sys


def main(argv: list[str]) -> None:
    sep = argv.index("--")
    specs, command = argv[:sep], argv[sep + 1:]
    offset = 0
    if specs[:1] == ["--pid-offset"]:
        offset = int(specs[1])
        specs = specs[2:]
    fds, names = [], []
    for spec in specs:
        fd, _, name = spec.partition("=")
        fds.append(int(fd))
        names.append(name)
    # Dup everything out of the way first, so moving one onto 3+i never clobbers another.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
    for fd in fds:
        os.close(fd)
    for i, fd in enumerate(high):
        os.dup2(fd, 3 + i)  # inheritable
        os.close(fd)
    os.environ["LISTEN_FDS"] = str(len(fds))
    if any(names):
        os.environ["LISTEN_FDNAMES"] = ":".join(names)
    os.environ["LISTEN_PID"] = str(os.getpid() + offset)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
