"""Reduced precision's shared parts: the user's calibration and labelled data (data.py) and the
gate that judges a candidate by the task (precision/gate.py). Each runtime's quantization lives in
its
backend's folder."""
