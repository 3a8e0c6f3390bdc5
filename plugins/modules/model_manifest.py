#!/usr/bin/python
"""Ansible module model_manifest: build a model directory's manifest, or check the directory against one."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_manifest
short_description: Build a model directory's manifest (size and sha256 per file), or verify a directory against it
version_added: 0.7.0
description:
  - V(built) hashes every file under O(path) (the top-level C(.cache), C(.git) and C(.fetch) directories are not
    the model) and returns the manifest in RV(document), written to O(manifest) too when given - each file's
    relative path, size and sha256, sorted, and the manifest's own digest, which covers only those, so the same
    bytes give the same digest on every node.
  - With O(hub_sha256) (the hub's LFS sha256 per file), V(built) refuses bytes whose sha256 is not the hub's,
    and a file the hub lists that O(path) lacks.
  - V(verified) checks O(path) against the manifest at O(manifest) and fails when a file is missing, short,
    long or corrupt, naming the node (O(node)), the file, both sizes and both digests. Files the manifest does
    not list are returned in RV(extras) and fail only with O(fail_on_extra).
  - O(size_only) makes V(verified) the cheap precheck - one stat per file, nothing read.
  - V(room) checks, before anything is copied, that the filesystem that will hold O(path) has room for what
    is still to fetch (the manifest's files not already present at full size) plus a margin, and fails naming
    the node, the path, the need and the free space. The manifest comes from O(document) or O(manifest); before
    any manifest exists (a hub's model not yet fetched), O(sizes) gives the files and their sizes instead.
  - Only reads the model; V(built) writes only O(manifest). Check mode reads and hashes as usual and writes
    nothing (plugins/module_utils/model/manifest.py).
options:
  path:
    description: The model directory.
    type: path
    required: true
  manifest:
    description: >-
      The manifest file - written by V(built) when given (its parent directories created), read by V(verified)
      (required). Inside O(path), it is left out of the manifest.
    type: path
  state:
    description: Build the manifest, verify the directory against it, or check there is room to fetch it.
    type: str
    choices: [built, verified, room]
    default: verified
  document:
    description: The manifest itself (a V(built) result's RV(document)), for V(room) instead of O(manifest).
    type: dict
  sizes:
    description: >-
      V(room) - the model's files and their sizes in bytes (C({path: size}), a hub's listing), instead of a
      manifest: a file already in O(path) at its size is counted as present.
    type: dict
  margin_fraction:
    description: V(room) - the margin kept free, as a fraction of the model's size.
    type: float
    default: 0.05
  margin_min_bytes:
    description: V(room) - the smallest margin kept free, in bytes.
    type: int
    default: 2147483648
  node:
    description: The node's name in every message (pass C(inventory_hostname)); the host name when omitted.
    type: str
  hub_sha256:
    description: The hub's LFS sha256 by relative path (V(built)); a file not in it is hashed without a reference.
    type: dict
    default: {}
  size_only:
    description: V(verified) compares sizes only (missing, short and long files; a corrupt byte is not seen).
    type: bool
    default: false
  fail_on_extra:
    description: V(verified) fails on files the manifest does not list too.
    type: bool
    default: false
  workers:
    description: Files hashed at once (threads; hashing runs outside Python's lock).
    type: int
    default: 4
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Build the manifest where the model arrived first
  vllm_ops.cluster.model_manifest:
    state: built
    path: /var/lib/vllm-cluster/models/llama-3.1-70b
    manifest: /var/lib/vllm-cluster/models/llama-3.1-70b.manifest.json
    node: "{{ inventory_hostname }}"
  register: built

- name: Check every node's copy before vLLM starts
  vllm_ops.cluster.model_manifest:
    state: verified
    path: /var/lib/vllm-cluster/models/llama-3.1-70b
    manifest: /var/lib/vllm-cluster/models/llama-3.1-70b.manifest.json
    node: "{{ inventory_hostname }}"
"""

RETURN = r"""
digest:
  description: The manifest's digest (sha256 of its paths, sizes and sha256s).
  returned: always
  type: str
  sample: 6f1c0b8e2d4a9f3e7c5b1a0d8e6f4c2a9b7d5e3f1a0c8b6d4e2f0a9c7b5d3e1f
manifest:
  description: The manifest file written or read (null when V(built) was given none).
  returned: always
  type: str
document:
  description: The manifest itself - format, digest, total_bytes and files (path, size, sha256, hub).
  returned: when state is built
  type: dict
files:
  description: The number of files the manifest lists.
  returned: always
  type: int
total_bytes:
  description: The bytes of the files the manifest lists.
  returned: always
  type: int
hub_checked:
  description: The files whose sha256 matched the hub's (V(built)).
  returned: when state is built
  type: list
  elements: str
problems:
  description: >-
    The files missing, short, long or corrupt (V(verified)), each - kind, path, expected_size, found_size,
    expected_sha256, found_sha256 (null where not read) and message.
  returned: when state is verified
  type: list
  elements: dict
  sample: [{"kind": "corrupt", "path": "model-00001-of-00030.safetensors", "expected_size": 4584408808,
            "found_size": 4584408808, "expected_sha256": "0b1d...", "found_sha256": "9a7c...",
            "message": "host node-b: model-00001-of-00030.safetensors: corrupt: expected ..."}]
extras:
  description: Files under O(path) the manifest does not list (V(verified); not looked for with O(size_only)).
  returned: when state is verified
  type: list
  elements: dict
free_bytes:
  description: V(room) - the bytes free for an unprivileged user on the filesystem that will hold O(path).
  returned: when state is room
  type: int
need_bytes:
  description: V(room) - what is still to fetch plus the margin.
  returned: when state is room
  type: int
checked_bytes:
  description: The bytes read and hashed (V(verified); 0 with O(size_only)).
  returned: when state is verified
  type: int
"""

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.host_state import free_space  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model.manifest import (  # noqa: E402
    ManifestError,
    build_manifest,
    complete_bytes,
    load_manifest,
    size_problems,
    verify_directory,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model.space import (  # noqa: E402
    DEFAULT_MARGIN_FRACTION,
    DEFAULT_MARGIN_MIN_BYTES,
    space_check,
)


def read_manifest(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return load_manifest(handle.read())
    except FileNotFoundError:
        return None


def write_manifest(path, document):
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def summary(path, document):
    return {"manifest": path, "digest": document["digest"], "files": len(document["files"]),
            "total_bytes": document["total_bytes"]}


def listing_document(sizes):
    """The part of a manifest the room check reads (each file's path and size, the total), from {path: size}."""
    files = []
    for path, size in sorted(sizes.items()):
        if type(size) is not int or size < 0:
            raise ManifestError(f"the size of {path} must be a whole number of bytes of at least 0, not {size!r}")
        files.append({"path": path, "size": size})
    return {"files": files, "total_bytes": sum(entry["size"] for entry in files)}


def room(module, node, root, manifest_path):
    params = module.params
    try:
        if params["sizes"]:
            document = listing_document(params["sizes"])
        else:
            document = load_manifest(params["document"]) if params["document"] else read_manifest(manifest_path)
    except (ManifestError, OSError) as error:
        module.fail_json(msg=f"host {node}: the manifest: {getattr(error, 'strerror', None) or error}")
    if document is None:
        module.fail_json(msg=f"host {node}: no manifest at {manifest_path}")
    present = complete_bytes(root, document) if os.path.isdir(root) else 0
    try:
        result = space_check(node, root, document["total_bytes"], free_space(root)["free_bytes"], present,
                             margin_fraction=params["margin_fraction"], margin_min_bytes=params["margin_min_bytes"])
    except (ValueError, OSError) as error:
        module.fail_json(msg=f"host {node}: {root}: {error}")
    if not result["fits"]:
        module.fail_json(msg=result.pop("message"), **result)
    module.exit_json(changed=False, msg=result.pop("message"), **result)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "manifest": {"type": "path"},
            "state": {"type": "str", "choices": ["built", "verified", "room"], "default": "verified"},
            "document": {"type": "dict"},
            "margin_fraction": {"type": "float", "default": DEFAULT_MARGIN_FRACTION},
            "margin_min_bytes": {"type": "int", "default": DEFAULT_MARGIN_MIN_BYTES},
            "node": {"type": "str"},
            "sizes": {"type": "dict"},
            "hub_sha256": {"type": "dict", "default": {}},
            "size_only": {"type": "bool", "default": False},
            "fail_on_extra": {"type": "bool", "default": False},
            "workers": {"type": "int", "default": 4},
        },
        required_if=[("state", "verified", ("manifest",)), ("state", "room", ("manifest", "document", "sizes"), True)],
        supports_check_mode=True,
    )
    params = module.params
    node = params["node"] or socket.gethostname()
    root = os.path.abspath(params["path"])
    manifest_path = os.path.abspath(params["manifest"]) if params["manifest"] else None

    if params["state"] == "built":
        inside = os.path.relpath(manifest_path, root) if manifest_path else ".."
        exclude = () if inside.startswith("..") else (inside.replace(os.sep, "/"),)
        try:
            document = build_manifest(root, node, hub_sha256=params["hub_sha256"], exclude=exclude,
                                      workers=params["workers"])
        except ManifestError as error:
            module.fail_json(msg=str(error).replace("\n", "; "))
        try:
            previous = read_manifest(manifest_path) if manifest_path else document
        except (ManifestError, OSError):
            previous = None  # unreadable: written again
        changed = previous != document
        if changed and not module.check_mode:
            try:
                write_manifest(manifest_path, document)
            except OSError as error:
                module.fail_json(msg=f"host {node}: cannot write {manifest_path}: {error.strerror}")
        module.exit_json(changed=changed, hub_checked=[entry["path"] for entry in document["files"] if entry["hub"]],
                         document=document, **summary(manifest_path, document))

    if params["state"] == "room":
        room(module, node, root, manifest_path)

    try:
        document = read_manifest(manifest_path)
    except (ManifestError, OSError) as error:
        module.fail_json(msg=f"host {node}: the manifest {manifest_path}: {getattr(error, 'strerror', None) or error}")
    if document is None:
        module.fail_json(msg=f"host {node}: no manifest at {manifest_path}")
    try:
        if params["size_only"]:
            result = {"problems": size_problems(root, document, node), "extras": [], "checked_bytes": 0}
        else:
            result = verify_directory(root, document, node, workers=params["workers"],
                                      extras_are_problems=params["fail_on_extra"])
    except ManifestError as error:
        module.fail_json(msg=str(error))
    outcome = dict(changed=False, **summary(manifest_path, document), **result)
    if result["problems"]:
        count = len(result["problems"])
        module.fail_json(msg=f"host {node}: {root} does not match the manifest {manifest_path} (digest {document['digest']}), "
                             f"{count} problem{'' if count == 1 else 's'}: "
                         + "; ".join(problem["message"] for problem in result["problems"]), **outcome)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
