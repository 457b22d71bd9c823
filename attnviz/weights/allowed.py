"""The app's allow-list of local model paths: which typed folder, or `.gguf` file, a deployment
lets a user load (`ATTNVIZ_ALLOWED_MODEL_DIRS`), resolved once so every spelling of one path is one
model, and how the app names it without showing where a path leads."""
from __future__ import annotations

import os
from pathlib import Path

from attnviz.base.limits import LIMITS


def local_folder_name(resolved: Path, limits=None) -> str:
    """How the app names an allowed folder: the allow-list entry as its operator wrote it, then the
    path inside it; the same for every spelling of one folder, and never a symlink's target
    outside the allow-list."""
    limits = limits or LIMITS
    for entry in limits.allowed_model_dirs.split(os.pathsep):
        entry = entry.strip()
        if not entry:
            continue
        try:
            root = Path(entry).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            continue
        if resolved == root or root in resolved.parents:
            rel = resolved.relative_to(root)
            return entry if rel == Path(".") else str(Path(entry) / rel)
    return resolved.name


def allowed_folder(typed: str, limits=None) -> tuple[Path, str]:
    """For the app: (resolved folder, its name) if `typed` names a folder inside the deployment's
    allow-list; ValueError otherwise, with one message for every refusal (see
    `Limits.check_model_dir`). With no allow-list set, every folder is refused."""
    limits = limits or LIMITS
    resolved = limits.check_model_dir(typed, required=True)
    return resolved, local_folder_name(resolved, limits)


def allowed_path(typed: str, limits=None) -> Path:
    """For the app: the resolved folder, or `.gguf` file, that `typed` names inside the deployment's
    allow-list; ValueError otherwise, one message for every refusal of a file (outside the list,
    missing, a link leading out of it, not a regular file), naming only what was typed."""
    limits = limits or LIMITS
    typed = str(typed).strip()
    if not typed.lower().endswith(".gguf"):
        return allowed_folder(typed, limits)[0]
    refusal = ValueError(f"{typed!r} is not a GGUF file in a folder this deployment loads models from")
    parent = Path(typed).expanduser().parent
    if not limits.allowed_model_dirs.strip():
        limits.check_model_dir(parent, required=True)   # this server loads no local models: it says so
    try:
        folder = limits.check_model_dir(parent, required=True) if str(parent) != "." else None
    except ValueError:
        raise refusal from None
    candidates = [folder / Path(typed).name] if folder else [r / typed for r in limits.allowed_dirs()]
    for candidate in candidates:
        try:   # the file itself, links followed, must lie in an allowed folder too
            resolved = candidate.resolve()
            if resolved.is_file() and limits.check_model_dir(resolved.parent, required=True) == resolved.parent:
                return resolved
        except (OSError, RuntimeError, ValueError):
            continue
    raise refusal
