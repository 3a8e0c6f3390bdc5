"""Parsers of ``nvidia-smi topo -m`` (link matrix, CPU and NUMA affinity, NIC names) and ``nvidia-smi nvlink -s``.

What the link types mean (``link_rank``, ``nvlink_count``, ``topology_links``)
is read in ``nvidia_smi``, next to the summary that uses it. Pure Python, no
Ansible import; unparseable text raises ``nvidia_smi.NvidiaSmiParseError``.
"""

from __future__ import annotations

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.cpuinfo import parse_cpulist
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi import (
    NvidiaSmiParseError,
    clean_value,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import strip_ansi

# ---------------------------------------------------------------- topo -m

_LINK_TOKEN = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")


def _split_glued(cell: str) -> list[str]:
    """'NODENODE' -> ['NODE', 'NODE']: pasted captures sometimes lose a tab."""
    cell = cell.strip()
    tokens = _LINK_TOKEN.findall(cell)
    if tokens and "".join(tokens) == cell:
        return tokens
    return [cell]


_AFFINITY_COLUMNS = {"cpu affinity": "cpu_affinity", "numa affinity": "numa_affinity", "gpu numa id": "gpu_numa_id"}


def parse_topo_matrix(text: str) -> dict:
    """Parse ``nvidia-smi topo -m``.

    Returns ``{devices, gpus, nics, matrix, affinity, nic_names, incomplete_rows}``:
    ``matrix[a][b]`` is the link type between devices a and b ('X', 'NV18',
    'PIX', 'PXB', 'PHB', 'NODE', 'SYS'); ``affinity[GPUn]`` holds cpu_affinity,
    cpus (expanded list), numa_affinity and gpu_numa_id (None when empty or
    N/A); ``nic_names`` maps 'NIC0' to 'mlx5_0' when the NIC legend is
    present. Rows cut short (as in pasted captures) are listed in
    ``incomplete_rows``; a GPU row cut short is an error.
    """
    lines = [strip_ansi(line).rstrip("\r\n") for line in (text or "").splitlines()]
    # The header is the last non-empty line before the first 'GPU0' row.
    header_index = None
    first_row = next((index for index, line in enumerate(lines) if re.match(r"^GPU0\s", line)), None)
    if first_row is not None:
        header_index = next(
            (index for index in range(first_row - 1, -1, -1) if lines[index].strip()), None
        )
    if header_index is not None and "GPU0" not in lines[header_index]:
        header_index = None
    if header_index is None:
        raise NvidiaSmiParseError("no topology matrix found: expected a header with GPU0 followed by a 'GPU0' row")
    header = lines[header_index]
    devices = re.findall(r"(?:GPU|NIC)\d+", header)
    expanded_header = header.expandtabs(8).lower()
    affinity_columns = sorted(
        (expanded_header.find(label), name) for label, name in _AFFINITY_COLUMNS.items() if label in expanded_header
    )

    matrix: dict = {}
    affinity: dict = {}
    incomplete: list[str] = []
    for line in lines[header_index + 1:]:
        if not line.strip():
            if matrix:
                break
            continue
        match = re.match(r"^\s*((?:GPU|NIC)\d+)(.*)$", line)
        if not match:
            break
        label = match.group(1)
        if "\t" in line:
            links, trailing = _split_tabbed_row(match.group(2), len(devices), affinity_columns)
        else:
            links, trailing = _split_spaced_row(line, len(label), len(devices), affinity_columns)
        matrix[label] = dict(zip(devices, links, strict=False))
        if len(links) < len(devices):
            if label.startswith("GPU"):
                raise NvidiaSmiParseError(f"topology row {label} has {len(links)} link cells, expected {len(devices)}")
            incomplete.append(label)
        if label.startswith("GPU"):
            entry = {name: clean_value(trailing.get(name)) for _, name in affinity_columns}
            cpu_text = entry.get("cpu_affinity")
            entry["cpus"] = parse_cpulist(cpu_text) if cpu_text else []
            affinity[label] = entry

    nic_names = {}
    for line in lines[header_index:]:
        legend = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", line)
        if legend:
            nic_names[legend.group(1)] = legend.group(2)

    if not any(label.startswith("GPU") for label in matrix):
        raise NvidiaSmiParseError("topology matrix has no GPU rows")
    return {
        "devices": devices,
        "gpus": [device for device in devices if device.startswith("GPU")],
        "nics": [device for device in devices if device.startswith("NIC")],
        "matrix": matrix,
        "affinity": affinity,
        "nic_names": nic_names,
        "incomplete_rows": incomplete,
    }


def _take_links(cells: list[str], device_count: int) -> tuple[list[str], int]:
    links: list[str] = []
    used = 0
    while used < len(cells) and len(links) < device_count:
        links.extend(_split_glued(cells[used]))
        used += 1
    return links[:device_count], used


def _split_tabbed_row(rest: str, device_count: int, affinity_columns: list) -> tuple[list[str], dict]:
    """A row as nvidia-smi prints it: tab-separated.

    nvidia-smi puts an empty cell before 'GPU NUMA ID', so with more cells than
    affinity columns the last cell belongs to the last column.
    """
    cells = rest.split("\t")
    if cells and cells[0].strip() == "":
        cells = cells[1:]
    links, used = _take_links(cells, device_count)
    extra = cells[used:]
    names = [name for _, name in affinity_columns]
    if names and len(extra) > len(names):
        extra = extra[: len(names) - 1] + [extra[-1]]
    return links, dict(zip(names, extra, strict=False))


def _split_spaced_row(line: str, label_length: int, device_count: int, affinity_columns: list) -> tuple[list[str], dict]:
    """A row whose tabs became spaces (pasted captures): affinity cells by column position.

    A cell belongs to the rightmost header column that starts no more than one
    tab stop (8 columns) after it, which places empty cells correctly.
    """
    tokens = [(m.start(), m.group()) for m in re.finditer(r"\S+", line) if m.start() >= label_length]
    links, used = _take_links([token for _, token in tokens], device_count)
    trailing: dict = {}
    for start, token in tokens[used:]:
        candidates = [name for offset, name in affinity_columns if offset <= start + 8]
        if candidates:
            trailing[candidates[-1]] = token
    return links, trailing


# ---------------------------------------------------------------- nvlink -s


def parse_nvlink_status(text: str) -> dict:
    """Parse ``nvidia-smi nvlink -s``.

    Returns ``{gpus: [{index, name, uuid, supported, links: [{link, active,
    speed_gb_s}], active_links, inactive_links, total_gb_s}]}``. ``supported``
    is False when nvidia-smi says NVLink queries do not apply (MIG mode).
    """
    gpus: list[dict] = []
    current: dict | None = None
    for raw in (text or "").splitlines():
        line = strip_ansi(raw).strip()
        if not line:
            continue
        header = re.match(r"^GPU (\d+): (.*?) \(UUID: ([^)]+)\)$", line)
        if header:
            current = {
                "index": int(header.group(1)),
                "name": header.group(2),
                "uuid": header.group(3),
                "supported": True,
                "links": [],
            }
            gpus.append(current)
            continue
        if current is None:
            raise NvidiaSmiParseError(f"nvlink -s: expected a 'GPU n: NAME (UUID: ...)' line first, got {line!r}")
        link = re.match(r"^Link (\d+): (.*)$", line)
        if link:
            speed = re.match(r"^(\d+(?:\.\d+)?) GB/s$", link.group(2).strip())
            current["links"].append(
                {"link": int(link.group(1)), "active": bool(speed), "speed_gb_s": float(speed.group(1)) if speed else None}
            )
        elif "not supported" in line.lower():
            current["supported"] = False
    for gpu in gpus:
        active = [link for link in gpu["links"] if link["active"]]
        gpu["active_links"] = len(active)
        gpu["inactive_links"] = len(gpu["links"]) - len(active)
        gpu["total_gb_s"] = round(sum(link["speed_gb_s"] for link in active), 3)
    if text and text.strip() and not gpus:
        raise NvidiaSmiParseError("nvlink -s output has no 'GPU n:' lines")
    return {"gpus": gpus}
