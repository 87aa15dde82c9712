"""The seccomp filter the ``bwrap`` backend installs before the interpreter starts: kernel interfaces a Python tool
program never needs fail with EPERM, whoever runs the sandbox.

The namespaces, the dropped capabilities and the unprivileged uid already refuse most of these; the filter takes
the kernel's attack surface away as well (io_uring, userfaultfd and BPF have each been the way out of a container),
and closes what those leave open: reading or steering the sandbox's init (``ptrace``, ``process_vm_*``,
``pidfd_getfd``, ``kcmp``), SysV and POSIX IPC objects, ``memfd_create`` and ``memfd_secret`` (memory held by the
kernel outside the program's ``RLIMIT_AS``; secret memory is also locked and taken out of the kernel's direct map),
classic AIO (``io_setup`` and the calls on its contexts: every context counts against the host-wide
``fs.aio-max-nr``, so one program could take them all and make the host's own ``io_setup`` fail), x86 segment
descriptors (``modify_ldt``, a long line of kernel bugs) and execution domains (``personality``).

It is a hand-written classic BPF program (one comparison per denied syscall) rather than libseccomp's Python
bindings: libseccomp publishes those only with its C sources (Debian's ``python3-seccomp`` is built for the
system interpreter, not this one; on PyPI there are third-party repackagings only, the ctypes one last released
in 2021), and a deny list over a two-architecture syscall table needs no compiler. Measured against that
repackaging (``pyseccomp`` 0.1.2, ctypes over the system's ``libseccomp.so.2``: a second system package beside
bubblewrap) on x86_64: for these syscalls libseccomp exports a program as long as this module's, and takes
far longer to build it; ``pip download seccomp`` and ``libseccomp`` find no distribution on PyPI. ``tests/test_sandbox.py`` checks
the numbers against the kernel headers and that each denied call fails with EPERM inside the sandbox.
"""

from __future__ import annotations

import platform
import struct

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
"""The ``AUDIT_ARCH_*`` value of each supported machine; syscalls of any other ABI (x32 included) kill."""

_NUMBERS: dict[str, tuple[int, int | None]] = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_open": (434, 434), "pidfd_getfd": (438, 438), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "userfaultfd": (323, 282), "personality": (135, 92), "bpf": (321, 280),
    "perf_event_open": (298, 241), "fanotify_init": (300, 262), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "chroot": (161, 51), "move_mount": (429, 429), "open_tree": (428, 428),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "unshare": (272, 97), "setns": (308, 268), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "acct": (163, 89), "quotactl": (179, 60), "syslog": (103, 116), "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265), "iopl": (172, None), "ioperm": (173, None), "shmget": (29, 194),
    "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197), "msgget": (68, 186), "msgsnd": (69, 189),
    "msgrcv": (70, 188), "msgctl": (71, 187), "semget": (64, 190), "semop": (65, 193), "semtimedop": (220, 192),
    "semctl": (66, 191), "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183), "mq_notify": (244, 184), "mq_getsetattr": (245, 185), "memfd_create": (319, 279),
    "memfd_secret": (447, 447), "io_setup": (206, 0), "io_destroy": (207, 1), "io_submit": (209, 2),
    "io_cancel": (210, 3), "io_getevents": (208, 4), "io_pgetevents": (333, 292), "modify_ldt": (154, None),
}
"""Syscall numbers (x86_64, aarch64; None: the machine has no such call), from the kernel's ``unistd`` headers."""

DENIED_SYSCALLS: dict[str, dict[str, int]] = {
    machine: {name: nrs[i] for name, nrs in _NUMBERS.items() if nrs[i] is not None}
    for i, machine in enumerate(("x86_64", "aarch64"))
}
"""Syscalls that fail with EPERM inside the sandbox, by machine."""

_RET_ALLOW, _RET_EPERM, _RET_KILL = 0x7FFF0000, 0x00050000 | 1, 0x80000000
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_X32_SYSCALL_BIT = 0x40000000


def seccomp_filter(machine: str = platform.machine()) -> bytes | None:
    """The filter as bwrap's ``--seccomp`` reads it (classic BPF over ``struct seccomp_data {int nr; u32 arch;
    u64 ip; u64 args[6]}``, little endian): another ABI kills, a denied syscall returns EPERM, anything else is
    allowed. None on a machine not listed (bwrap then runs without a filter)."""
    if machine not in AUDIT_ARCH:
        return None
    nrs = sorted(DENIED_SYSCALLS[machine].values())

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("<HBBI", code, jt, jf, k)

    eperm, kill = 5 + len(nrs), 6 + len(nrs)  # the return block (allow, eperm, kill) follows the checks
    prog = [op(_LD, 4), op(_JEQ, AUDIT_ARCH[machine], 0, kill - 2), op(_LD, 0), op(_JGE, _X32_SYSCALL_BIT, kill - 4, 0)]
    prog += [op(_JEQ, nr, eperm - (4 + i) - 1, 0) for i, nr in enumerate(nrs)]
    prog += [op(_RET, r) for r in (_RET_ALLOW, _RET_EPERM, _RET_KILL)]
    assert len(prog) == kill + 1
    return b"".join(prog)
