"""The machine and its processes: the environment and CPU features (system/environment.py), GPUs and
their libraries (system/gpu.py, system/gpu_libraries.py, system/envcheck.py), memory
(system/resources.py), settings kept
between runs (system/settings.py), child processes (system/children.py), quiet runtimes
(system/quiet.py), paths
(system/paths.py)."""
