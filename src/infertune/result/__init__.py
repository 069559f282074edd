"""The result of tuning, apart from how it was found: which candidate serves which calls
(choice.py), the call paths built once from that choice (calling.py), and its saved form on
disk (saved.py). Knows the backends, never the pipeline."""
