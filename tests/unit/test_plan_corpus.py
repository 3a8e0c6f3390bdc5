"""Plans do not change by accident: 1,010 saved requests give the same plan, or the same PlanError, as when saved.

The corpus (tests/fixtures/plans/corpus.json.gz, written by plan_corpus.py; when, its
docstring says) holds the seed's examples, the lab's layouts and seeded random
requests over every strategy, backend and device. Any change in a plan's bytes (a key, a
number, an argv item, a sentence of the decision) or in an error's wording fails here,
naming the request and the first keys that differ.
"""

import gzip
import json

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import PlanError, plan_from_request
from plan_corpus import CORPUS, outcome

ENTRIES = json.loads(gzip.decompress(CORPUS.read_bytes()))


def _differences(saved, now, path=""):
    if type(saved) is not type(now):
        return [f"{path or '.'}: {saved!r} -> {now!r}"]
    if isinstance(saved, dict):
        found = []
        for key in sorted(set(saved) | set(now), key=str):
            if key not in now:
                found.append(f"{path}.{key}: removed")
            elif key not in saved:
                found.append(f"{path}.{key}: added")
            else:
                found += _differences(saved[key], now[key], f"{path}.{key}")
        return found
    if isinstance(saved, list) and len(saved) == len(now):
        return [d for index, (a, b) in enumerate(zip(saved, now, strict=True))
                for d in _differences(a, b, f"{path}[{index}]")]
    return [] if saved == now else [f"{path or '.'}: {saved!r} -> {now!r}"]


def test_the_corpus_covers_every_strategy_backend_and_device():
    plans = [entry["plan"] for entry in ENTRIES if "plan" in entry]
    assert {plan["strategy"] for plan in plans} == {"single", "dp_replicas", "tp", "tp_pp", "ep_dp"}
    assert {plan["backend"] for plan in plans} == {"mp", "ray"}
    assert {plan["cluster"]["device"] for plan in plans} == {"cuda", "cpu"}
    assert len(plans) >= 400 and len(ENTRIES) - len(plans) >= 400


def test_every_request_gives_the_saved_plan_or_error():
    changed = []
    for entry in ENTRIES:
        now = outcome(entry["request"], plan_from_request, PlanError)
        saved = {key: entry[key] for key in ("plan", "error") if key in entry}
        differences = _differences(saved, json.loads(json.dumps(now)))
        if differences:
            changed.append(f"{entry['label']}: " + "; ".join(differences[:6]))
    assert not changed, f"{len(changed)} of {len(ENTRIES)} requests changed:\n" + "\n".join(changed[:20])


def test_a_changed_plan_is_named():
    entry = next(entry for entry in ENTRIES if "plan" in entry)
    altered = json.loads(json.dumps(entry["plan"]))
    altered["nodes"][0]["argv"].append("--enforce-eager")
    altered["tp"] += 1
    found = _differences({"plan": entry["plan"]}, {"plan": altered})
    assert found == [f".plan.nodes[0].argv: {entry['plan']['nodes'][0]['argv']!r} -> {altered['nodes'][0]['argv']!r}",
                     f".plan.tp: {entry['plan']['tp']!r} -> {altered['tp']!r}"]
