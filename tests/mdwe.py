"""Run a command under the kernel's memory-deny-write-execute rule (prctl PR_SET_MDWE, Linux
6.3+): what systemd's MemoryDenyWriteExecute=yes enforces with seccomp, here enforced by the
kernel and inherited across fork and execve. ``python tests/mdwe.py -- CMD ...``; exits 77 when
the kernel lacks it (a caller skips)."""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
UNSUPPORTED = 77


def main() -> None:
    argv = sys.argv[sys.argv.index("--") + 1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        print(f"mdwe: prctl(PR_SET_MDWE): {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        sys.exit(UNSUPPORTED)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
