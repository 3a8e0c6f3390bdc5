"""The doctor: the signature catalog, the evidence, its observations, the diagnosis, the report, the checklist.

docs/doctor.md ("Where the code is") says which file holds what.
"""
