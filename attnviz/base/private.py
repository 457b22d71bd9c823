"""The server's own private folder, for what it keeps between runs (the corpus tool's results files).

The shared temporary folder is everyone's: a fixed name there can be made first by another user,
or made a symlink to another folder, and whatever the server then writes, reads back or deletes
there is theirs to choose. So the server's files live in a folder that is checked every time it is
used: created 0700, opened without following a symlink (O_NOFOLLOW), owned by this process's user
and open to no one else. A folder that fails any check is refused with a message for the operator,
never used and never "repaired" (files may already have been planted in it).

`ATTNVIZ_PRIVATE_DIR` names the folder; by default it is `attnviz-<uid>` in the temporary folder
(per user, so two accounts on one machine never share one).
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

PRIVATE_ENV = "ATTNVIZ_PRIVATE_DIR"


def private_root() -> Path:
    named = os.environ.get(PRIVATE_ENV, "").strip()
    return Path(named) if named else Path(tempfile.gettempdir()) / f"attnviz-{os.getuid()}"


def _checked(path: Path) -> Path:
    """`path` made (0700) if missing, then checked: a folder, not a symlink, ours, no one else's."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise ValueError(f"the server cannot make its private folder {path} ({err.strerror}); "
                         f"its operator can name another with {PRIVATE_ENV}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:     # ELOOP (a symlink) or ENOTDIR (a file)
        raise ValueError(f"the server's private folder {path} is a symlink or not a folder, so it is not "
                         f"used; its operator should remove it or name another with {PRIVATE_ENV}") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise ValueError(f"the server's private folder {path} belongs to another user or is open to others "
                         f"(mode {stat.S_IMODE(info.st_mode):o}), so it is not used; its operator should "
                         f"remove it or name another with {PRIVATE_ENV}")
    return path


def private_dir(*parts: str) -> Path:
    """The private folder (or a subfolder of it, each level checked the same way), ValueError saying
    what the operator should do when it cannot be trusted."""
    path = _checked(private_root())
    for part in parts:
        path = _checked(path / part)
    return path


def open_private(path: Path, append: bool = True):
    """A results file in a private folder opened without following a symlink (created 0600)."""
    flags = os.O_NOFOLLOW | (os.O_WRONLY | os.O_APPEND | os.O_CREAT if append else os.O_RDONLY)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as err:
        raise ValueError(f"{Path(path).name} cannot be opened ({err.strerror}): a results file is a plain "
                         "file, never a link") from None
    return os.fdopen(fd, "a" if append else "r", encoding="utf-8", errors="replace" if not append else "strict")
