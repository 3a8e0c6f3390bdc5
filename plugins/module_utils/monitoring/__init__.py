"""Monitoring: Prometheus's targets and the plan's recording rules, from the plans of a fleet."""
