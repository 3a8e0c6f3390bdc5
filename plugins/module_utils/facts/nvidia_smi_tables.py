"""Parsers of nvidia-smi's flat outputs: ``--query-*`` CSV, ``dmon`` / ``pmon``, the default table, ``--version``.

Also ``split_capture_sections``, which cuts a capture bundle (sections under
``# $ <command>`` banners) into the outputs the nvidia-smi parsers read. Pure
Python, no Ansible import; unparseable text raises
``nvidia_smi.NvidiaSmiParseError``.
"""

from __future__ import annotations

import csv
import io
import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi import (
    NvidiaSmiParseError,
    clean_value,
    to_int,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import strip_ansi

_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")
_NUMBER_WITH_UNIT = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|W|%|MHz|us|ms|s|C|KB/s|GB/s|bank\(s\))$")


# ---------------------------------------------------------------- CSV queries

# Fields whose values stay text even when they look like numbers.
_STRING_FIELDS = {
    "timestamp", "driver_version", "kmd_version", "name", "serial", "uuid", "vbios_version", "compute_cap",
    "hostname", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "process_name", "fabric.clusteruuid",
    "fabric.cliqueid", "platform.chassis_serial_number", "platform.gpu_fabric_guid", "retired_pages.address",
    "retired_pages.timestamp", "gpu_recovery_action", "gsp.mode.current", "gsp.mode.default",
}
_STRING_PREFIXES = ("pci.", "inforom.", "clocks_event_reasons.", "clocks_throttle_reasons.", "vgpu")

# The fields gpu_facts' CSV cross-check and the lab's nvidia-smi double use.
QUERY_GPU_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used", "memory.free",
    "utilization.gpu", "compute_cap", "persistence_mode", "mig.mode.current",
)


def _field_name(header_cell: str) -> tuple[str, str | None]:
    match = re.match(r"^\s*(.*?)\s*(?:\[(.*)\])?\s*$", header_cell)
    return match.group(1), match.group(2)


def _csv_value(field: str, raw: str):
    value = clean_value(raw)
    if value is None:
        return None
    lowered = field.lower()
    if lowered in _STRING_FIELDS or lowered.startswith(_STRING_PREFIXES):
        return value
    with_unit = _NUMBER_WITH_UNIT.match(value)
    number = with_unit.group(1) if with_unit else (value if _NUMBER.match(value) else None)
    if number is None:
        return value
    return float(number) if "." in number else int(number)


def parse_query_gpu_csv(text: str, fields: list[str] | tuple[str, ...] | None = None) -> list[dict]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    Also reads ``--query-compute-apps`` and the other ``--query-*`` switches.
    With a header the field names come from it (units such as '[MiB]' are
    removed); without one, pass ``fields`` in query order. Numbers become int
    or float (units stripped), '[N/A]', '[Not Supported]' and the like become
    None, and identifiers (uuid, bus id, versions, compute_cap) stay strings.
    """
    rows = [row for row in csv.reader(io.StringIO(text or ""), skipinitialspace=True) if any(c.strip() for c in row)]
    if not rows:
        return []
    first = [_field_name(cell)[0] for cell in rows[0]]
    header_present = fields is None or [f.lower() for f in first] == [f.lower() for f in fields]
    if fields is None:
        names = first
        data = rows[1:]
        if not all(re.match(r"^[a-z_][a-z0-9_.]*$", name, re.IGNORECASE) for name in names):
            raise NvidiaSmiParseError(f"expected a CSV header of nvidia-smi field names, got {rows[0]!r}")
    else:
        names = list(fields)
        data = rows[1:] if header_present else rows
    result = []
    for row in data:
        if len(row) != len(names):
            raise NvidiaSmiParseError(
                f"CSV row has {len(row)} values for {len(names)} fields: {', '.join(row)[:200]!r}"
            )
        result.append({name: _csv_value(name, cell) for name, cell in zip(names, row, strict=True)})
    return result


# ---------------------------------------------------------------- dmon / pmon


def _monitor_rows(text: str) -> list[dict]:
    """Rows of dmon/pmon output keyed by the lower-case names of the last '# gpu ...' header."""
    columns: list[str] | None = None
    rows: list[dict] = []
    for raw in (text or "").splitlines():
        line = strip_ansi(raw).rstrip()
        if not line.strip():
            continue
        if line.startswith("#"):
            # Two header lines: names ('# gpu pwr ...'), then units ('# Idx W ...').
            names = [name.lower() for name in line[1:].split()]
            if "gpu" in names:
                columns = names
            continue
        if columns is None:
            raise NvidiaSmiParseError(f"monitor output row before any '# gpu ...' header: {line!r}")
        cells = line.split()
        if len(cells) < len(columns):
            raise NvidiaSmiParseError(f"monitor row has {len(cells)} values for {len(columns)} columns: {line!r}")
        if len(cells) > len(columns):
            # Only the last column (pmon's command name) can hold spaces.
            cells = cells[: len(columns) - 1] + [" ".join(cells[len(columns) - 1:])]
        rows.append(dict(zip(columns, cells, strict=True)))
    return rows


def _monitor_number(value: str):
    if value in ("-", "N/A"):
        return None
    if _NUMBER.match(value):
        return float(value) if "." in value else int(value)
    return value


def parse_dmon(text: str) -> list[dict]:
    """Parse ``nvidia-smi dmon`` (any ``-s`` selection, ``-o DT`` too).

    One dict per sample row with ``gpu`` and each metric column (lower-case
    names from the header: pwr, gtemp, sm, mem, fb, ...) as int/float, or
    None where dmon printed '-'.
    """
    return [{key: _monitor_number(value) for key, value in row.items()} for row in _monitor_rows(text)]


def parse_pmon(text: str) -> list[dict]:
    """Parse ``nvidia-smi pmon``: one dict per row (gpu, pid, type, sm, mem, ..., command)."""
    rows = []
    for row in _monitor_rows(text):
        parsed = {
            key: ((None if value == "-" else value) if key in ("type", "command") else _monitor_number(value))
            for key, value in row.items()
        }
        rows.append(parsed)
    return rows


# ---------------------------------------------------------------- default table


def parse_default_table(text: str) -> dict:
    """Parse the plain ``nvidia-smi`` table: versions, one entry per GPU, processes."""
    header = re.search(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)", text or "")
    if not header:
        raise NvidiaSmiParseError("expected the nvidia-smi table header with 'Driver Version' and 'CUDA Version'")
    gpus: list[dict] = []
    processes: list[dict] = []
    lines = (text or "").splitlines()
    in_processes = False
    for index, line in enumerate(lines):
        if "Processes:" in line:
            in_processes = True
            continue
        first = re.match(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+(\S+)\s+(\S+)\s+\|\s+(.+?)\s+\|$", line)
        if first and not in_processes:
            second = lines[index + 1] if index + 1 < len(lines) else ""
            third = lines[index + 2] if index + 2 < len(lines) else ""
            memory = re.search(r"(\d+)MiB\s*/\s*(\d+)MiB", second)
            mig = re.search(r"\|\s*(\S+)\s*\|$", third)
            gpus.append(
                {
                    "index": int(first.group(1)),
                    "name": first.group(2).strip(),
                    "persistence_mode": first.group(3) == "On",
                    "pci_bus_id": first.group(4),
                    "memory_used_mib": int(memory.group(1)) if memory else None,
                    "memory_total_mib": int(memory.group(2)) if memory else None,
                    "volatile_uncorrectable_ecc": to_int(first.group(6)),
                    "mig_mode": clean_value(mig.group(1)) if mig else None,
                }
            )
            continue
        process = re.match(
            r"^\|\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(C\+G|C|G)\s+(.+?)\s+(\d+)MiB\s*\|$", line
        )
        if process and in_processes:
            processes.append(
                {
                    "gpu": int(process.group(1)),
                    "gpu_instance_id": to_int(process.group(2)),
                    "compute_instance_id": to_int(process.group(3)),
                    "pid": int(process.group(4)),
                    "type": process.group(5),
                    "name": process.group(6),
                    "used_memory_mib": int(process.group(7)),
                }
            )
    return {
        "driver_version": header.group(1),
        "cuda_version": clean_value(header.group(2)),
        "gpus": gpus,
        "processes": processes,
    }


def parse_version(text: str) -> dict:
    """Parse ``nvidia-smi --version``: {nvidia_smi, nvml, driver, cuda}."""
    values = {}
    for line in (text or "").splitlines():
        key, separator, value = line.partition(":")
        if separator:
            values[key.strip().lower()] = value.strip()
    if "driver version" not in values:
        raise NvidiaSmiParseError("expected nvidia-smi --version output with a 'DRIVER version' line")
    return {
        "nvidia_smi": values.get("nvidia-smi version"),
        "nvml": values.get("nvml version"),
        "driver": values.get("driver version"),
        "cuda": values.get("cuda version"),
    }


# ---------------------------------------------------------------- capture bundles


def split_capture_sections(text: str) -> list[dict]:
    """Split a capture bundle into sections.

    A section starts with a '#####' rule, '# <title>' and optionally
    '# $ <command>' lines, and a closing '#####' rule; its body runs to the
    next opening rule. Returns ``[{title, command, body}]``.
    """
    lines = (text or "").splitlines()
    sections: list[dict] = []
    index = 0
    rule = re.compile(r"^#{20,}\s*$")
    while index < len(lines):
        if rule.match(lines[index]):
            banner_end = index + 1
            while banner_end < len(lines) and lines[banner_end].startswith("#") and not rule.match(lines[banner_end]):
                banner_end += 1
            if banner_end < len(lines) and rule.match(lines[banner_end]):
                banner = [line[1:].strip() for line in lines[index + 1:banner_end]]
                command = next((line[2:].strip() for line in banner if line.startswith("$ ")), None)
                title = next((line for line in banner if not line.startswith("$ ")), "")
                body_start = banner_end + 1
                body_end = body_start
                while body_end < len(lines) and not (
                    rule.match(lines[body_end])
                    and body_end + 1 < len(lines)
                    and lines[body_end + 1].startswith("# ")
                ):
                    body_end += 1
                sections.append({"title": title, "command": command, "body": "\n".join(lines[body_start:body_end])})
                index = body_end
                continue
        index += 1
    return sections
