"""A PEP 517 build backend in the standard library alone, for this one pure-Python package.

`pip wheel --no-deps --no-build-isolation lab/vllm_cpu_ray_plugin` calls it, and so
does scripts/build-lab-wheels directly (no pip, no setuptools, no download). The wheel
is reproducible: fixed file order and timestamps, so a rebuild gives the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCH = (1980, 1, 1, 0, 0, 0)


def _project():
    return tomllib.loads((HERE / "pyproject.toml").read_text())["project"]


def _package_files(name):
    package = HERE / name.replace("-", "_")
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _metadata(project):
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}",
             f"Summary: {project['description']}", f"Requires-Python: {project['requires-python']}"]
    return "\n".join(lines) + "\n"


def _entry_points(project):
    text = ""
    for group, entries in project.get("entry-points", {}).items():
        text += f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in entries.items()) + "\n"
    return text


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}\n"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project = _project()
    stem = f"{project['name'].replace('-', '_')}-{project['version']}"
    dist_info = f"{stem}.dist-info"
    files = [(str(p.relative_to(HERE)), p.read_bytes()) for p in _package_files(project["name"])]
    files += [
        (f"{dist_info}/METADATA", _metadata(project).encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: stdlib_wheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{dist_info}/entry_points.txt", _entry_points(project).encode()),
    ]
    record = "".join(_record_line(path, data) for path, data in files) + f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))
    name = f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files:
            info = zipfile.ZipInfo(path, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return name


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    stem = f"{project['name'].replace('-', '_')}-{project['version']}"
    paths = [HERE / "pyproject.toml", HERE / "stdlib_wheel.py", *_package_files(project["name"])]
    name = f"{stem}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as sdist:
        for path in paths:
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{stem}/{path.relative_to(HERE)}")
            info.size, info.mode = len(data), 0o644
            sdist.addfile(info, io.BytesIO(data))
        pkg_info = _metadata(project).encode()
        info = tarfile.TarInfo(f"{stem}/PKG-INFO")
        info.size, info.mode = len(pkg_info), 0o644
        sdist.addfile(info, io.BytesIO(pkg_info))
    return name
