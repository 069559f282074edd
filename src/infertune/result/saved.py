"""The saved form of a result: `Optimized.save(path)` writes one, `infertune.load(path)`
restores it.

A saved result is a directory:

    manifest.json     format version, infertune version, the choice (which candidate serves
                      which calls, result/choice.py) and each chosen candidate's entry (name,
                      kind, precision, settings, directory), the sha256 of every other file,
                      the input signature, the output signature (names, dtypes, shapes), the
                      tuning options, the environment and its fingerprint
    report.json       the Report of the optimize() run that chose it
    model.onnx | model.tflite | model.savedmodel/ | model.keras    what the general choice runs
    batch-backends/N/ the artifact of each other candidate chosen at a tuned batch size
    exact-shape/      the artifact of the exact-shape path, where there is one

Nothing in it executes code when loaded: no pickle; a .keras file is loaded in Keras' safe
mode. Reading refuses a directory whose files differ from the manifest (modified, missing or
added). Loading an ONNX Runtime or OpenVINO result does not import TensorFlow.

Format version 1 (infertune 0.1.0 before the choice had one format) is read through
`_migrated`: its entries and keys become version 2's, and its output shapes, which it did not
record, are observed by running the restored result once at two batch sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._version import __version__
from ..backends.base import Backend
from ..backends.registry import backend_class
from ..backends.tf_function import tensorflow_missing
from ..errors import ArtifactError, EnvironmentMismatchError, ExportError, one_line
from ..model.inputs import InputSignature
from ..model.outputs import (
    OutputSignature,
    TensorSpec,
)
from ..model.structure import Structure
from ..model.target import Target
from ..report import Report
from ..system.environment import (
    collect_environment,
    differences,
    fingerprint,
    install_hint,
)
from .calling import flat_runner
from .choice import Choice

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "REPORT",
    "Saved",
    "file_sha256",
    "open_saved",
    "read_manifest",
    "restore",
    "save",
    "verify_files",
]

FORMAT = "infertune-saved-result"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
REPORT = "report.json"
EXACT_SHAPE_DIR = "exact-shape"
BATCH_DIR = "batch-backends"
BUCKET_DIR = "bucket-backends"  # the candidates only the buckets use (optimize(traffic=...))
_REQUIRED = ("choice", "backends", "files", "inputs", "outputs", "options", "environment")


# -- save -------------------------------------------------------------------------------------
def save(
    choice: Choice,
    report: Report,
    options: dict,
    path: Path,
    *,
    copy_of: Saved | None = None,
    extra: dict | None = None,
) -> Path:
    """Write the result in the directory `path` (new, or empty); return the path.

    `copy_of`: the saved result this one was loaded from; its files are copied (and its
    environment kept: measured where it was tuned, not where it was copied). The files are
    written beside `path` first and moved into place at the end, so a failed or interrupted
    save leaves no half-written result. `extra` is merged into the manifest.
    """
    check_target(path)
    for backend in choice.backends:
        if backend_class(type(backend).name) is not type(backend):
            raise ExportError(
                f"The selected candidate {backend.name!r} ({type(backend).__qualname__}) is "
                f"not one of infertune's registered backends, so load() could not rebuild it. "
                f"Register its class in infertune.backends.BACKENDS, or choose a built-in "
                f"candidate."
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.saving-", dir=path.parent))
    try:
        if copy_of is not None:
            entries = _copy_files(copy_of, staging)
            environment = copy_of.manifest["environment"]
        else:
            entries = _write_backends(choice, staging)
            environment = report.environment
        report.to_json(staging / REPORT)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "infertune_version": __version__,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": report.model,
            "choice": choice.to_dict(),
            "backends": entries,
            "options": options,
            "inputs": choice.inputs.to_dict(),
            "outputs": choice.outputs.to_dict(),
            "files": _hash_files(staging),
            "environment": environment,
            "fingerprint": fingerprint(environment),
            **(extra or {}),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if path.exists():
            path.rmdir()  # empty, checked above
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def check_target(path: Path) -> None:
    """ExportError unless `path` is new or an empty directory: what save() needs, checked
    before any long work (the CLI's --save)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ExportError(
            f"Cannot save to '{path}': it exists and is not an empty directory. Choose a new "
            f"directory, or remove this one first."
        )


def _write_backends(choice: Choice, directory: Path) -> list[dict]:
    """Each chosen backend's files, the general choice's at the top and the others in a
    directory each; their manifest entries."""
    entries = [_entry(choice.general, directory, None)]
    for i, backend in enumerate(choice.general_backends[1:]):
        entries.append(_entry(backend, directory, f"{BATCH_DIR}/{i}"))
    if choice.exact_shape is not None:
        entries.append(_entry(choice.exact_shape, directory, EXACT_SHAPE_DIR))
    written = {entry["name"] for entry in entries}
    for i, backend in enumerate(b for b in choice.backends if b.name not in written):
        entries.append(_entry(backend, directory, f"{BUCKET_DIR}/{i}"))
    return entries


def _entry(backend: Backend, root: Path, sub: str | None) -> dict:
    where = root if sub is None else root / sub
    where.mkdir(parents=True, exist_ok=True)
    try:
        settings = backend.save_artifact(where)
    except NotImplementedError as exc:
        raise ExportError(
            f"{exc}. Choose a candidate that can be saved (onnxruntime-cpu*, openvino-cpu*, "
            f"litert*, tf-function, tf-xla, keras-eager): backends=[...] in Python, --backends "
            f"on the command line."
        ) from None
    except Exception as exc:
        raise ExportError(f"Saving the {backend.name} candidate failed: {one_line(exc)}") from exc
    json.dumps(settings)  # JSON-able, or a bug in the backend: fail here, not at load
    entry = {
        "name": backend.name,
        "kind": type(backend).name,
        "precision": backend.precision,
        "requires": backend.requires,
        "settings": settings,
    }
    if sub is not None:
        entry["dir"] = sub
    return entry


def _copy_files(source: Saved, directory: Path) -> list[dict]:
    """A loaded result's files, checked again, into `directory`; its entries."""
    verify_files(source.path, source.manifest)
    for rel in source.manifest["files"]:
        if rel != REPORT:
            (directory / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source.path / rel, directory / rel)
    return source.manifest["backends"]


def _hash_files(directory: Path) -> dict:
    return {
        rel: {"sha256": file_sha256(directory / rel), "bytes": (directory / rel).stat().st_size}
        for rel in _relative_files(directory)
    }


def _relative_files(directory: Path) -> list[str]:
    """Every file under `directory` but the manifest, as sorted POSIX relative paths."""
    files = []
    for root, _, names in os.walk(directory):
        for name in names:
            rel = (Path(root) / name).relative_to(directory).as_posix()
            if rel != MANIFEST:
                files.append(rel)
    return sorted(files)


def file_sha256(path: Path) -> str:
    """A file's sha256, read in 1 MB blocks (saved results and packages list them)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- reading and checking ---------------------------------------------------------------------
@dataclass
class Saved:
    """A saved result on disk, its manifest read (in format version 2) and its files checked."""

    path: Path
    manifest: dict

    @property
    def entries(self) -> list[dict]:
        """Each chosen candidate's manifest entry, the general choice first."""
        return self.manifest["backends"]

    @property
    def general(self) -> dict:
        return self.entry(self.manifest["choice"]["general"])

    def entry(self, name: str) -> dict:
        return next(e for e in self.entries if e["name"] == name)

    def directory(self, entry: dict) -> Path:
        """Where an entry's files are."""
        return self.path / entry["dir"] if entry.get("dir") else self.path

    @property
    def inputs(self) -> InputSignature:
        return InputSignature.from_dict(self.manifest["inputs"])

    @property
    def outputs(self) -> OutputSignature:
        """The output signature: recorded since format version 2; for version 1, observed
        by running the restored result (its backends loaded and closed again)."""
        if "specs" in self.manifest["outputs"]:
            return OutputSignature.from_dict(self.manifest["outputs"])
        choice, _ = restore(self)
        choice.close()
        return choice.outputs

    def classes(self) -> list[type[Backend]]:
        """The backend class of every entry; EnvironmentMismatchError for one this infertune
        does not know."""
        classes = []
        for entry in self.entries:
            cls = backend_class(entry["kind"])
            if cls is None:
                raise EnvironmentMismatchError(
                    f"'{self.path}' was saved with the {entry['name']} candidate, which this "
                    f"infertune does not know (saved by infertune "
                    f"{self.manifest.get('infertune_version')}). Install that version, or tune "
                    f"again."
                )
            classes.append(cls)
        return classes

    def unavailable(self) -> str | None:
        """Why a chosen candidate cannot run here, in words with the fix, or None."""
        for cls, entry in zip(self.classes(), self.entries):
            reason = cls().available()
            if reason is None:
                continue
            extra = entry.get("requires")
            fix = install_hint(extra) if extra else "install its runtime"
            strings = self.inputs.strings
            why = (
                f" The model takes string inputs ({', '.join(strings)}), which only TensorFlow "
                f"runs (no converter takes strings): any result for it needs TensorFlow."
                if strings and tensorflow_missing() is not None
                else ""
            )
            return (
                f"The saved result uses the {entry['name']} candidate, which cannot run here: "
                f"{reason}.{why} Install what it needs ({fix}), or pass model=, sample_input= "
                f"and on_mismatch='retune' to tune again among the candidates that run here."
            )
        return None

    def changes(self) -> list[str]:
        """How this environment differs from the one the result was tuned in (CPU, GPUs, the
        versions of its runtimes), in words."""
        classes = self.classes()
        packages = tuple(dict.fromkeys(p for cls in classes for p in cls.runtime_packages))
        current = collect_environment(packages)
        return differences(self.manifest["environment"], current, packages)


def open_saved(path: str | os.PathLike) -> Saved:
    """The saved result in `path`: manifest read and migrated, every file checked."""
    path = Path(path)
    manifest = read_manifest(path)
    verify_files(path, manifest)
    return Saved(path, manifest)


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a saved result in format version 2 (an older one migrated in memory),
    checked for format and version (not yet the files)."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(
            f"No saved result at '{path}': expected a directory written by Optimized.save()."
        )
    file = path / MANIFEST
    if not file.is_file():
        raise ArtifactError(
            f"'{path}' has no {MANIFEST}, so it is not a result written by Optimized.save()."
        )
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{MANIFEST} in '{path}' is not valid JSON: {exc}.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(
            f"{MANIFEST} in '{path}' is not an infertune manifest (its format is "
            f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, expected "
            f"{FORMAT!r})."
        )
    version = manifest.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise ArtifactError(f"{MANIFEST} in '{path}' has no valid format_version ({version!r}).")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"'{path}' was saved in format version {version} by infertune "
            f"{manifest.get('infertune_version')}; this infertune ({__version__}) reads format "
            f"versions up to {FORMAT_VERSION}. Install a newer infertune."
        )
    if version == 1:
        manifest = _migrated(manifest, path)
    missing = [key for key in _REQUIRED if key not in manifest]
    for i, entry in enumerate(manifest.get("backends") or [{}]):
        missing += [
            f"backends[{i}].{key}" for key in ("name", "kind", "settings") if key not in entry
        ]
    if missing:
        raise ArtifactError(f"{MANIFEST} in '{path}' lacks {', '.join(missing)}.")
    _check_choice(path, manifest)
    _check_setting_paths(path, manifest)
    return manifest


def _migrated(manifest: dict, path: Path) -> dict:
    """A format version 1 manifest as version 2: "backend", "batch_backends" and
    "exact_backend" become "backends" and "choice"; the output dtypes stay without specs
    (Saved.outputs observes them)."""
    v1_keys = ("backend", "batch_backends", "by_batch", "exact_backend")
    migrated = {k: v for k, v in manifest.items() if k not in v1_keys}
    if not isinstance(manifest.get("backend"), dict):
        raise ArtifactError(f"{MANIFEST} in '{path}' (format version 1) lacks backend.")
    exact = manifest.get("exact_backend")
    entries = [manifest["backend"], *manifest.get("batch_backends", [])]
    if exact:
        entries.append({k: v for k, v in exact.items() if k != "shapes"})
    migrated["backends"] = entries
    migrated["choice"] = {
        "general": manifest["backend"].get("name"),
        "by_batch": manifest.get("by_batch"),
        "exact_shape": {"backend": exact["name"], "shapes": exact["shapes"]} if exact else None,
    }
    return migrated


def _check_choice(path: Path, manifest: dict) -> None:
    """Every candidate the choice names has an entry."""
    names = {entry["name"] for entry in manifest["backends"]}
    try:
        named = Choice.names(manifest["choice"])
    except (KeyError, TypeError, AttributeError):
        raise ArtifactError(f"{MANIFEST} in '{path}' has a malformed choice.") from None
    unknown = [name for name in named if name not in names]
    if unknown:
        raise ArtifactError(
            f"{MANIFEST} in '{path}' chooses {', '.join(unknown)}, which it has no entry for."
        )


def _check_setting_paths(path: Path, manifest: dict) -> None:
    """The directories the entries name, and the files their settings name ("file",
    "fixed_file", "data_file", "dir"), are among the hashed files."""
    files = manifest["files"]
    for entry in manifest["backends"]:
        prefix = ""
        if "dir" in entry:
            where = entry["dir"]
            if not isinstance(where, str) or ".." in Path(where).parts:
                raise ArtifactError(f"{MANIFEST} in '{path}' names a bad directory: {where!r}.")
            prefix = f"{where}/"
        for key in ("file", "fixed_file", "data_file", "dir"):
            value = entry["settings"].get(key)
            if value is None:
                continue
            value = prefix + value if isinstance(value, str) else value
            listed = (
                any(f.startswith(f"{value}/") for f in files) if key == "dir" else value in files
            )
            if not isinstance(value, str) or ".." in Path(value).parts or not listed:
                raise ArtifactError(
                    f"{MANIFEST} in '{path}' names a {key} the manifest does not list: {value!r}."
                )


def verify_files(path: Path, manifest: dict) -> None:
    """Every file the manifest lists is there with its sha256, and no other file is."""
    root = path.resolve()
    listed = manifest["files"]
    for rel, meta in listed.items():
        file = (path / rel).resolve()
        if root not in file.parents:
            raise ArtifactError(f"{MANIFEST} in '{path}' names a file outside it: {rel!r}.")
        if not file.is_file():
            raise ArtifactError(
                f"'{rel}' is missing from '{path}' (the manifest lists it): the saved result is "
                f"incomplete. Save it again from the model."
            )
        digest = file_sha256(file)
        if digest != meta.get("sha256"):
            raise ArtifactError(
                f"'{rel}' in '{path}' was modified after it was saved: its sha256 is "
                f"{digest[:16]}..., the manifest says {str(meta.get('sha256'))[:16]}... "
                f"infertune does not load modified artifacts; save the result again."
            )
    extra = [rel for rel in _relative_files(path) if rel not in listed]
    if extra:
        raise ArtifactError(
            f"'{extra[0]}' in '{path}' was not written by save() (the manifest does not list "
            f"it{f', nor {len(extra) - 1} other files' if len(extra) > 1 else ''}). infertune "
            f"does not load a result with added files; remove them or save the result again."
        )


# -- restore ----------------------------------------------------------------------------------
def restore(saved: Saved) -> tuple[Choice, Report]:
    """The choice, every backend loaded from its files (no tuning, no conversion), and the
    report. EnvironmentMismatchError where an artifact does not load here."""
    manifest = saved.manifest
    inputs = saved.inputs
    specs = "specs" in manifest["outputs"]
    outputs = (
        OutputSignature.from_dict(manifest["outputs"])
        if specs
        else _unobserved(manifest["outputs"])
    )
    objective = manifest["options"].get("objective", "latency")
    backends = {}
    try:
        for cls, entry in zip(saved.classes(), saved.entries):
            # Each backend gets a target of its own: shared conversions are per artifact.
            target = Target(None, inputs, outputs.structure, outputs.dtypes, objective)
            backends[entry["name"]] = _load_backend(cls, entry, saved, target)
        choice = Choice.from_dict(manifest["choice"], backends.__getitem__, inputs, outputs)
        if not specs:
            choice.outputs = _observed(choice)
    except BaseException:
        for backend in backends.values():
            backend.close()
        raise
    return choice, Report.from_json(saved.path / REPORT)


def _load_backend(cls: type[Backend], entry: dict, saved: Saved, target: Target) -> Backend:
    where = saved.directory(entry)
    try:
        backend = cls.load_artifact(where, entry["settings"], target)
    except Exception as exc:  # the files are verified: what fails is this environment
        then = saved.manifest["environment"].get("packages", {})
        versions = ", ".join(f"{p} {then.get(p) or 'absent'}" for p in cls.runtime_packages)
        raise EnvironmentMismatchError(
            f"The {entry['name']} artifact in '{where}' does not load here: {one_line(exc)}. "
            f"It was saved with {versions or 'its runtime'}; install those versions, or pass "
            f"model=, sample_input= and on_mismatch='retune' to tune again."
        ) from exc
    backend.name = entry["name"]
    return backend


def _unobserved(data: dict) -> OutputSignature:
    """A version 1 manifest's outputs: structure and dtypes, shapes not yet known."""
    structure = Structure.from_dict(data["structure"])
    names = OutputSignature.names_of(structure)
    dtypes = [np.dtype(d) for d in data["dtypes"]]
    return OutputSignature(structure, tuple(TensorSpec(n, d, ()) for n, d in zip(names, dtypes)))


def _observed(choice: Choice) -> OutputSignature:
    """The output signature of a restored version 1 result, from two runs on random inputs
    drawn like the tuning sample: at its batch size and, where the batch is free, one more."""
    inputs, structure = choice.inputs, choice.outputs.structure
    run = flat_runner(choice)
    rng = np.random.default_rng(0)
    calls = [run(inputs.random_inputs(rng))]
    if inputs.batch_is_dynamic and inputs.sample_batch is not None:
        calls.append(run(inputs.random_inputs(rng, batch=inputs.sample_batch + 1)))
    free_features = any(None in spec.shape[1:] for spec in inputs.specs)
    return OutputSignature.observed(structure, calls, free_features)
