"""Small text helpers every parser uses: ANSI colour codes, IP addresses, argv flags.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import ipaddress
import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str | None) -> str:
    """The text without terminal colour and cursor codes (vLLM and Ray colour their logs)."""
    return _ANSI.sub("", text or "")


def is_ip(text) -> bool:
    """Whether text is an IPv4 or IPv6 address (not a host name)."""
    try:
        ipaddress.ip_address(text)
    except (TypeError, ValueError):
        return False
    return True


def flag_value(argv, flag: str) -> str | None:
    """The value of ``flag`` in argv, as ``--flag value`` or ``--flag=value``; None when absent."""
    for index, arg in enumerate(argv):
        if arg == flag and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
