"""The doctor: the symptom catalog, its observations, the diagnosis, the report, the checklist."""
