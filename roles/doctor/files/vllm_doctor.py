#!/usr/bin/env python3
"""The doctor's controller side: diagnose saved evidence, or evaluate the seed's checklist.

    vllm_doctor.py diagnose --catalog signatures.yml --evidence doctor-evidence.json \
        [--markdown doctor.md] [--json doctor.json] [--evidence-lines 8] [--report-shown PATH] \
        [--prometheus http://10.0.0.5:9090 [--prometheus-lookback 5m]]
    vllm_doctor.py checklist --evidence checklist-evidence.json [--results DIR] \
        [--markdown checklist.md] [--json checklist.json]

The evidence file is what the doctor role writes under results/<deployment>/:
{"plan": ..., "hosts": [...], "gather": [...], "gpu": [...], "ib": [...]}, the
registered results of doctor_gather, gpu_facts and ib_facts per node. Running
this script again on a saved file gives the same report, offline. With
--prometheus, what Prometheus knows of the deployment (firing alerts, each
replica's trend) is asked first and saved into the evidence file as "metrics",
so the replay needs no Prometheus either. It prints one
JSON object on stdout (the summary the playbook reads). All logic is in the
collection's plugins/module_utils/doctor/ (catalog.py loads the signatures,
diagnosis.py matches them, report.py renders the report; checklist.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _collection_imports():
    """Put the directory above ansible_collections/ on sys.path (this file lives inside the collection)."""
    here = os.path.abspath(__file__)
    while here != os.path.dirname(here):
        here = os.path.dirname(here)
        if os.path.basename(here) == "ansible_collections":
            sys.path.insert(0, os.path.dirname(here))
            return
    raise SystemExit(f"{__file__}: not inside an ansible_collections/ tree; run it from the installed collection")


def _evidence(reader, data):
    try:
        return reader(data)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def _write(path, text):
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def diagnose(args):
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import diagnosis
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import evidence_from_saved
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.report import (
        first_finding,
        render_markdown,
        render_report,
    )

    catalog = load_catalog_file(args.catalog)
    with open(args.evidence, encoding="utf-8") as handle:
        data = json.load(handle)
    if args.prometheus:
        from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import metrics

        data["metrics"] = metrics.gather(args.prometheus, (data.get("plan") or {}).get("deployment"),
                                         args.prometheus_lookback)
        _write(args.evidence, json.dumps(data) + "\n")
    report = diagnosis.diagnose(catalog, _evidence(evidence_from_saved, data))
    report["plan_source"] = data.get("plan_source") or {}
    _write(args.markdown, render_markdown(report))
    _write(args.json, json.dumps(report, indent=2) + "\n")
    faults = [f for f in report["findings"] if f["severity"] == "fault"]
    summary = {
        "faults": report["faults"],
        "warnings": report["warnings"],
        "deployment": report["deployment"],
        "top": faults[0] if faults else None,
        "first_finding": first_finding(report, args.report_shown or args.markdown),
        "findings": [{"id": f["id"], "severity": f["severity"], "nodes": f["nodes"]} for f in report["findings"]],
        "lines": render_report(report, args.evidence_lines),
    }
    print(json.dumps(summary))


def checklist(args):
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import checklist as seed_checklist
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
        evidence_from_registered,
        saved_hosts,
    )

    with open(args.evidence, encoding="utf-8") as handle:
        data = json.load(handle)
    evidence = evidence_from_registered(data.get("plan"), _evidence(saved_hosts, data))
    evidence["results"] = seed_checklist.read_results(args.results) if args.results else {}
    report = seed_checklist.evaluate(evidence)
    _write(args.markdown, seed_checklist.render_markdown(report))
    _write(args.json, json.dumps(report, indent=2) + "\n")
    print(json.dumps({**report["summary"], "lines": seed_checklist.render_lines(report)}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("diagnose", help="match the signature catalog against saved evidence")
    one.add_argument("--catalog", required=True)
    one.add_argument("--evidence", required=True)
    one.add_argument("--markdown")
    one.add_argument("--json")
    one.add_argument("--evidence-lines", type=int, default=8)
    one.add_argument("--report-shown", help="the Markdown report's path as the first finding names it")
    one.add_argument("--prometheus", help="a Prometheus that scrapes the deployment (role vllm_monitoring)")
    one.add_argument("--prometheus-lookback", default="5m", help="the trend's look-back (a Prometheus duration)")
    one.set_defaults(func=diagnose)
    two = sub.add_parser("checklist", help="evaluate the seed's checklist (7.1) on saved evidence")
    two.add_argument("--evidence", required=True)
    two.add_argument("--results", help="results/<deployment>/ with benchmark and verification outputs")
    two.add_argument("--markdown")
    two.add_argument("--json")
    two.set_defaults(func=checklist)
    args = parser.parse_args(argv)
    _collection_imports()
    args.func(args)


if __name__ == "__main__":
    main()
