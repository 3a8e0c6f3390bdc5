"""The benchmark: the fixed load profile, its verdicts against the baseline, the report."""
