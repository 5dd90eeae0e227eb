"""Run a command under two of lameduck.service's sandboxing rules, enforced by the kernel
without systemd as pid 1, so a test can see lameduck work under them:

- ``SystemCallFilter=@system-service`` then ``~@privileged`` with
  ``SystemCallErrorNumber=EPERM``: a seccomp filter (libseccomp, as systemd builds its own)
  that allows the system calls of those groups, expanded by ``systemd-analyze syscall-filter``,
  and fails every other with EPERM;
- ``MemoryDenyWriteExecute=yes``: prctl(PR_SET_MDWE) (Linux 6.3+), the same rule.

Both are inherited across fork and execve. ``python tests/sandbox.py -- CMD ...``; exits 77
when the host lacks one of them (systemd-analyze, libseccomp, PR_SET_MDWE): a caller skips.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import subprocess
import sys

PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO = 0x00050000  # | errno
UNSUPPORTED = 77


def groups() -> dict[str, list[str]]:
    """Every systemd system-call group and its entries (system calls and nested @groups), from
    one `systemd-analyze syscall-filter` run: the wrapper starts each sandboxed process, so
    it stays quick on a loaded machine."""
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    table: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = table.setdefault(line.strip(), [])
        elif line.startswith((" ", "\t")) and current is not None:
            word = line.strip()
            if word and not word.startswith("#"):
                current.append(word)
        else:
            current = None  # a comment or note at the left margin ends a group
    return table


def expand(table: dict[str, list[str]], name: str, seen: set[str] | None = None) -> set[str]:
    """The system calls of a group, nested groups expanded."""
    seen = set() if seen is None else seen
    seen.add(name)
    calls: set[str] = set()
    for word in table[name]:
        if word.startswith("@"):
            if word not in seen:
                calls |= expand(table, word, seen)
        else:
            calls.add(word)
    return calls


def unsupported(why: str) -> None:
    print(f"sandbox: {why}", file=sys.stderr)
    sys.exit(UNSUPPORTED)


def main() -> None:
    argv = sys.argv[sys.argv.index("--") + 1:]
    try:
        table = groups()
        allowed = expand(table, "@system-service") - expand(table, "@privileged")
    except (OSError, subprocess.CalledProcessError, KeyError) as e:
        unsupported(f"systemd-analyze syscall-filter: {e!r}")
    name = ctypes.util.find_library("seccomp")
    if name is None:
        unsupported("no libseccomp")
    lib = ctypes.CDLL(name)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                     ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ERRNO | errno.EPERM)
    for call in sorted(allowed):
        nr = lib.seccomp_syscall_resolve_name(call.encode())
        if nr >= 0:  # unknown on this architecture: nothing to allow
            assert lib.seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) == 0, call
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        unsupported(f"prctl(PR_SET_MDWE): {os.strerror(ctypes.get_errno())}")
    if lib.seccomp_load(ctx) != 0:  # sets no_new_privs first, as NoNewPrivileges=yes
        unsupported("seccomp_load failed")
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
