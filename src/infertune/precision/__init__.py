"""Reduced precision's shared parts: the user's calibration and labelled data (data.py), the
gate that judges a candidate by the task (gate.py), and the layers every runtime's int8 can
keep in float32, found and ranked by the error each adds (layers.py). Each runtime's
quantization lives in its backend's folder."""
