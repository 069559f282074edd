"""Conversions of the model to other formats, shared by the backends that run them."""
