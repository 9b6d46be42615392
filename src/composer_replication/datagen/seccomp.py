"""A seccomp filter for the bubblewrap sandbox: no kernel keyrings, no new namespaces (pure Python, no libseccomp).

What is covered: `deny_filter` assembles a classic-BPF seccomp program (bwrap loads it with
``--seccomp FD`` just before it runs the command) that makes these system calls fail inside the sandbox:

- ``keyctl``, ``add_key``, ``request_key`` -> ``EPERM``: a sandboxed process cannot read, add, link or
  search any key, including keys in the session keyring it inherited from the harness (which it would
  otherwise *possess* and so could read even after dropping to another uid), the user keyrings, or
  ``/proc/keys``-listed keys it could name by serial;
- ``unshare``, ``setns`` and ``clone`` with any ``CLONE_NEW*`` flag -> ``EPERM``: no user namespace (a
  rich kernel attack surface that as root-started sandboxes would otherwise allow), no other namespace;
- ``clone3`` -> ``ENOSYS`` (its flags live in memory a filter cannot read; the C library falls back to
  ``clone``, as under Docker's default profile);
- the x32 ABI -> ``ENOSYS``; a foreign architecture (one the program does not know) kills the process.

Architectures: x86_64 (+ i386 compat) and aarch64 (+ 32-bit ARM compat). Docker's default seccomp
profile denies the same keyring and namespace calls, so both backends agree.

What is not covered: every other system call is allowed (the rest of the isolation is namespaces,
no capabilities, ``no_new_privs`` and rlimits; this is not a syscall allow-list).
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]
_OFF_NR, _OFF_ARCH, _OFF_ARG0_LO = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NEW_MASK = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
)

# Syscall numbers from the kernel headers, one column per ABI: x86_64, i386, aarch64, 32-bit ARM.
_NR = {
    "add_key":     (248, 286, 217, 309),
    "request_key": (249, 287, 218, 310),
    "keyctl":      (250, 288, 219, 311),
    "unshare":     (272, 310, 97, 337),
    "setns":       (308, 346, 268, 375),
    "clone":       (56, 120, 220, 120),
    "clone3":      (435, 435, 435, 435),
}  # fmt: skip
# Each architecture's ABIs: (AUDIT_ARCH_*, its column of _NR, whether the x32 ABI, whose numbers carry
# X32_SYSCALL_BIT, shares its AUDIT_ARCH).
_ABIS = {
    "x86_64": [(0xC000003E, 0, True), (0x40000003, 1, False)],
    "aarch64": [(0xC00000B7, 2, False), (0x40000028, 3, False)],
}
_ARCHES: dict[str, list[tuple[int, dict[str, int], bool]]] = {
    arch: [(audit, {name: row[col] for name, row in _NR.items()}, x32) for audit, col, x32 in abis]
    for arch, abis in _ABIS.items()
}
DENIED = ("keyctl", "add_key", "request_key", "unshare", "setns")


def _errno(code: int) -> int:
    return _RET_ERRNO | (code & 0xFFFF)


def _assemble(prog: list[tuple]) -> bytes:
    """Resolve ("label", name) markers and symbolic jump targets into packed ``struct sock_filter``s."""
    labels: dict[str, int] = {}
    insns: list[tuple] = []
    for item in prog:
        if item[0] == "label":
            labels[item[1]] = len(insns)
        else:
            insns.append(item)
    out = bytearray()
    for pc, (code, k, jt, jf) in enumerate(insns):

        def rel(target: str | int, pc: int = pc) -> int:
            if isinstance(target, int):
                return target
            off = labels[target] - pc - 1
            if not 0 <= off <= 255:
                raise ValueError(f"seccomp jump to {target!r} out of range ({off})")
            return off

        out += struct.pack("=HBBI", code, rel(jt), rel(jf), k)
    return bytes(out)


def deny_filter(machine: str | None = None) -> bytes:
    """The BPF program (bytes of ``struct sock_filter[]``) for ``machine`` (default: this host's).

    Raises ``ValueError`` for an architecture without a table (the sandbox then refuses to start).
    """
    machine = machine or platform.machine()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp syscall table for architecture {machine!r} (known: {sorted(_ARCHES)})")
    prog: list[tuple] = [(_LD_W_ABS, _OFF_ARCH, 0, 0)]
    for i, (audit_arch, nr, has_x32) in enumerate(_ARCHES[machine]):
        nxt = f"arch{i + 1}"
        prog.append((_JEQ_K, audit_arch, 0, nxt))
        prog.append((_LD_W_ABS, _OFF_NR, 0, 0))
        if has_x32:
            prog.append((_JGE_K, X32_SYSCALL_BIT, "enosys", 0))
        for name in DENIED:
            prog.append((_JEQ_K, nr[name], "eperm", 0))
        prog.append((_JEQ_K, nr["clone3"], "enosys", 0))
        prog.append((_JEQ_K, nr["clone"], 0, "allow"))
        prog.append((_LD_W_ABS, _OFF_ARG0_LO, 0, 0))
        prog.append((_JSET_K, CLONE_NEW_MASK, "eperm", "allow"))
        prog.append(("label", nxt))
    prog += [
        (_RET_K, RET_KILL_PROCESS, 0, 0),  # an architecture this filter does not describe
        ("label", "allow"),
        (_RET_K, RET_ALLOW, 0, 0),
        ("label", "eperm"),
        (_RET_K, _errno(errno.EPERM), 0, 0),
        ("label", "enosys"),
        (_RET_K, _errno(errno.ENOSYS), 0, 0),
    ]
    return _assemble(prog)
