"""The signature catalog: failures kept as data, loaded and validated.

Symptom -> checks -> cause -> fix lives in a YAML catalog
(``roles/doctor/files/signatures.yml``), never in code branches.
``load_catalog`` checks that data (ids, families, priorities, the texts an
operator reads: title, symptom, cause, fix and ``verify``, the command or short
procedure that shows the fix worked; every rule's log pattern or observation
name, ``explains``) and refuses the first problem
with a ``CatalogError`` that names the signature and the field; it returns the
catalog with its patterns compiled, as ``diagnosis.diagnose`` reads it.

Pure Python 3.11, no Ansible import (PyYAML only in ``load_catalog_file``).
"""

from __future__ import annotations

import os
import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations import OBSERVATIONS
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.raise_site import load_subsystems_file

CATALOG_VERSION = 1
FAMILIES = ("startup", "communication", "performance")
SEVERITIES = ("fault", "warning")
LOG_SOURCES = ("vllm", "ray", "any")
_ID = re.compile(r"^[a-z][a-z0-9_]{1,63}$")


class CatalogError(ValueError):
    """The signature catalog is malformed; the message names the signature and the field."""


def _require(condition, where, message):
    if not condition:
        raise CatalogError(f"{where}: {message}")


def _text_field(sig, key, where, required=True):
    value = sig.get(key)
    if value is None and not required:
        return None
    _require(isinstance(value, str) and value.strip(), where, f"'{key}' must be a non-empty string, got {value!r}")
    return value.strip()


def _check_rule(rule, where):
    _require(isinstance(rule, dict), where, f"each rule must be a mapping, got {rule!r}")
    kinds = [key for key in ("log", "observation") if key in rule]
    _require(len(kinds) == 1, where, f"a rule has exactly one of 'log' or 'observation', got {sorted(rule)}")
    unknown = set(rule) - {"log", "observation", "params", "requires"}
    _require(not unknown, where, f"unknown rule keys {sorted(unknown)}")
    checked = {"requires": []}
    requires = rule.get("requires", [])
    _require(
        isinstance(requires, list) and all(isinstance(name, str) for name in requires),
        where,
        f"'requires' must be a list of observation names, got {requires!r}",
    )
    for name in requires:
        _require(name in OBSERVATIONS, where, f"'requires' names the unknown observation {name!r}")
    checked["requires"] = list(requires)
    if "log" in rule:
        log = rule["log"]
        _require(isinstance(log, dict), where, f"'log' must be a mapping with 'pattern', got {log!r}")
        pattern = log.get("pattern")
        _require(isinstance(pattern, str) and pattern, where, "'log.pattern' must be a regular expression")
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            raise CatalogError(f"{where}: 'log.pattern' {pattern!r} is not a valid regular expression: {error}") from None
        sources = log.get("sources", ["any"])
        _require(
            isinstance(sources, list) and sources and all(source in LOG_SOURCES for source in sources),
            where,
            f"'log.sources' must be a list of {list(LOG_SOURCES)}, got {sources!r}",
        )
        after = log.get("after", 0)
        _require(
            isinstance(after, int) and not isinstance(after, bool) and 0 <= after <= 20,
            where,
            f"'log.after' (lines quoted after the match) must be an integer 0-20, got {after!r}",
        )
        unknown = set(log) - {"pattern", "sources", "after"}
        _require(not unknown, where, f"unknown log keys {sorted(unknown)}")
        checked["log"] = {"pattern": pattern, "regex": compiled, "sources": list(sources), "after": after}
    else:
        name = rule["observation"]
        _require(name in OBSERVATIONS, where, f"unknown observation {name!r}; known: {sorted(OBSERVATIONS)}")
        params = rule.get("params", {})
        _require(isinstance(params, dict), where, f"'params' must be a mapping, got {params!r}")
        checked["observation"] = name
        checked["params"] = dict(params)
    return checked


def load_catalog(data):
    """Validate the catalog data (as YAML loads it) and return it with compiled patterns.

    Raises CatalogError naming the signature and field at the first problem.
    """
    _require(isinstance(data, dict), "catalog", f"must be a mapping, got {type(data).__name__}")
    _require(
        data.get("catalog_version") == CATALOG_VERSION,
        "catalog",
        f"catalog_version must be {CATALOG_VERSION}, got {data.get('catalog_version')!r}",
    )
    signatures = data.get("signatures")
    _require(isinstance(signatures, list) and signatures, "catalog", "'signatures' must be a non-empty list")
    checked = []
    seen = set()
    for index, sig in enumerate(signatures):
        where = f"signature #{index + 1}"
        _require(isinstance(sig, dict), where, f"must be a mapping, got {sig!r}")
        sig_id = sig.get("id")
        _require(isinstance(sig_id, str) and _ID.match(sig_id), where, f"'id' must match {_ID.pattern}, got {sig_id!r}")
        where = f"signature {sig_id}"
        _require(sig_id not in seen, where, "the id is used twice")
        seen.add(sig_id)
        allowed = {
            "id", "family", "seed_branch", "severity", "priority", "title", "symptom", "checks",
            "cause", "fix", "verify", "match", "explains", "references", "defaults",
        }
        unknown = set(sig) - allowed
        _require(not unknown, where, f"unknown keys {sorted(unknown)}")
        family = sig.get("family")
        _require(family in FAMILIES, where, f"'family' must be one of {list(FAMILIES)}, got {family!r}")
        severity = sig.get("severity", "fault")
        _require(severity in SEVERITIES, where, f"'severity' must be one of {list(SEVERITIES)}, got {severity!r}")
        priority = sig.get("priority")
        _require(
            isinstance(priority, int) and not isinstance(priority, bool) and 1 <= priority <= 100,
            where,
            f"'priority' must be an integer 1-100, got {priority!r}",
        )
        checks = sig.get("checks")
        _require(
            isinstance(checks, list) and checks and all(isinstance(c, str) and c.strip() for c in checks),
            where,
            "'checks' must be a non-empty list of strings",
        )
        match = sig.get("match")
        _require(isinstance(match, dict) and set(match) == {"any"}, where, "'match' must be a mapping with only 'any'")
        rules = match["any"]
        _require(isinstance(rules, list) and rules, where, "'match.any' must be a non-empty list of rules")
        explains = sig.get("explains", [])
        _require(
            isinstance(explains, list) and all(isinstance(name, str) for name in explains),
            where,
            f"'explains' must be a list of signature ids, got {explains!r}",
        )
        defaults = sig.get("defaults", {})
        _require(
            isinstance(defaults, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in defaults.items()),
            where,
            f"'defaults' must map placeholder names to strings, got {defaults!r}",
        )
        references = sig.get("references", [])
        _require(
            isinstance(references, list) and all(isinstance(ref, str) for ref in references),
            where,
            "'references' must be a list of strings",
        )
        checked.append(
            {
                "id": sig_id,
                "family": family,
                "seed_branch": _text_field(sig, "seed_branch", where, required=False),
                "severity": severity,
                "priority": priority,
                "title": _text_field(sig, "title", where),
                "symptom": _text_field(sig, "symptom", where),
                "checks": [c.strip() for c in checks],
                "cause": _text_field(sig, "cause", where),
                "fix": _text_field(sig, "fix", where),
                "verify": _text_field(sig, "verify", where),
                "rules": [_check_rule(rule, f"{where}, rule #{n + 1}") for n, rule in enumerate(rules)],
                "explains": list(explains),
                "references": list(references),
                "defaults": dict(defaults),
            }
        )
    for sig in checked:
        for name in sig["explains"]:
            _require(name in seen, f"signature {sig['id']}", f"'explains' names the unknown signature {name!r}")
            _require(name != sig["id"], f"signature {sig['id']}", "a signature cannot explain itself")
    return {"catalog_version": CATALOG_VERSION, "signatures": checked}


def load_catalog_file(path):
    """The catalog at ``path``, with the subsystem table (``subsystems``) of the subsystems.yml beside it, if any."""
    import yaml  # the controller has PyYAML (Ansible needs it); only this loader uses it

    with open(path, encoding="utf-8") as handle:
        catalog = load_catalog(yaml.safe_load(handle))
    table = os.path.join(os.path.dirname(os.path.abspath(path)), "subsystems.yml")
    catalog["subsystems"] = load_subsystems_file(table) if os.path.isfile(table) else None
    return catalog
