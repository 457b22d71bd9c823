"""Models by name: "org/name" or "org/name@revision", read from the Hugging Face cache.

huggingface_hub resolves names, revisions and the cache (the standard `models--org--name/` layout:
`refs/<branch>` holds a commit, `snapshots/<commit>/` is a plain model folder), so a cached model is
loaded by `folders.load_dir` like any local folder. Reading the cache needs no network and no
setting. Downloading is the operator's choice: `LIMITS.hub` (ATTNVIZ_HUB=1) and a name matching
one of `LIMITS.hub_allow`'s patterns (ATTNVIZ_HUB_ALLOW="Qwen/*,meta-llama/*"). A download is planned
from the Hub's file metadata first (`plan`): safetensors weights only, no repo that asks for its own
code, every file's size known and the weights within `LIMITS.max_weight_bytes` before one byte is
fetched; then `download` fetches exactly those files, at exactly the commit that was sized.
"""
from __future__ import annotations

import fnmatch
import glob
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, scan_cache_dir, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import (CacheNotFound, GatedRepoError, HFValidationError, OfflineModeIsEnabled,
                                    RepositoryNotFoundError, RevisionNotFoundError)
from huggingface_hub.utils import tqdm as hf_tqdm
from huggingface_hub.utils import validate_repo_id

from attnviz.base.jobs import JobCancelled
from attnviz.base.limits import LIMITS
from attnviz.weights.families import hf_family
from attnviz.weights.folders import (FOLDER_TASKS, MAX_TOKENIZER_BYTES, TOKENIZER_FILES, TWO_SIDED_TOKENIZER_FILES,
                                     Folder, load_dir, size_text)

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
NAME = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9._/-]{{0,99}}))?")
COMMIT = re.compile(r"[0-9a-f]{40}")
# What a download fetches besides the weights: a transformers folder without any code.
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "preprocessor_config.json", "model.safetensors.index.json")
WEIGHTS = re.compile(r"model(?:-\d{5}-of-\d{5})?\.safetensors")
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_LISTED = 200  # cached models offered in the app's picker
TEXT_TASKS = ("encoder", "lm", "translation")


def parse(name) -> tuple[str, str | None]:
    """("org/name", revision or None) for "org/name" or "org/name@revision"; ValueError otherwise."""
    shape = (f"{str(name)[:80]!r} is not a Hugging Face model name: write org/name or org/name@revision "
             "(a branch or a commit hash)")
    m = NAME.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(shape)
    repo, revision = m["repo"], m["revision"]
    if ".." in name or "--" in repo or (revision and ("//" in revision or revision.endswith("/"))):
        raise ValueError(shape)
    try:
        validate_repo_id(repo)
    except HFValidationError:
        raise ValueError(shape) from None
    return repo, revision


def names_a_repo(text: str) -> bool:
    """Whether `load_model` reads `text` as a name: it has a "/", and is no path (absolute, ~ or
    ./ relative) and nothing on disk."""
    return ("/" in text and not text.startswith(("/", ".", "~")) and not os.path.isabs(text)
            and not os.path.lexists(text))


def cache_dir() -> Path:
    """The Hugging Face cache, read from the environment at each call (huggingface_hub reads it
    once at import), with its precedence: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub,
    XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub."""
    env = os.environ
    raw = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not raw:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"),
                                                  "huggingface")
        raw = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(raw)))


def repo_dir(repo: str) -> Path:
    return cache_dir() / ("models--" + repo.replace("/", "--"))


def cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The snapshot folder of `repo` at `revision` (a branch in refs/, default main, or a commit) if
    the cache holds one with a config.json, inside this repo's own folder of the cache."""
    try:
        found = try_to_load_from_cache(repo, "config.json", cache_dir=str(cache_dir()), revision=revision or "main")
    except (OSError, ValueError):
        return None
    if not isinstance(found, str):
        return None
    snapshot = Path(found).parent
    try:   # a ref that holds anything but a commit, or a snapshot that leads elsewhere, is no snapshot
        inside = snapshot.resolve().parent == (repo_dir(repo) / "snapshots").resolve()
    except (OSError, RuntimeError):
        return None
    return snapshot if inside and COMMIT.fullmatch(snapshot.name) else None


def check_snapshot(snapshot: Path, name: str, limits=None) -> None:
    """What a cached snapshot must be before it is loaded: its files inside the repo's own folder of
    the cache (blobs/), safetensors weights (never pickle), and no call for the repo's own code."""
    folder = Folder(snapshot, repr(name), limits or LIMITS)
    root = repo_dir(parse(name)[0]).resolve()
    entries = folder.entries()
    for file in entries:
        try:
            resolved = (snapshot / file).resolve()
        except (OSError, RuntimeError):
            raise folder.fail(f"{file} in the cache cannot be read") from None
        if root not in resolved.parents:
            raise folder.fail(f"{file} in the cache leads outside this model's cache folder")
    if not any(f.endswith(".safetensors") for f in entries):
        pickles = sorted(f for f in entries if f.endswith(PICKLES))
        if pickles:
            raise folder.fail(f"has only pickle weights ({', '.join(pickles[:3])}); models by name are read "
                              "from safetensors only, and nothing is ever unpickled")
        raise folder.fail("has no weights in the cache: expected model.safetensors")
    for file in ("config.json", "tokenizer_config.json"):
        if file in entries:
            refuse_remote_code(folder.read_json(file), name, file)


def refuse_remote_code(config: dict, name: str, where: str = "config.json") -> None:
    """A config naming the repo's own classes (auto_map) needs its code: refused by name."""
    auto = config.get("auto_map") if isinstance(config, dict) else None
    if auto:
        shown = ", ".join(f"{k} -> {v}" for k, v in list(auto.items())[:2]) if isinstance(auto, dict) else str(auto)
        raise ValueError(f"{name!r}: {where} asks for the repo's own code (auto_map: {shown[:120]}); "
                         "attnviz never runs code from a model repo")


def load_named(name: str, key: str | None = None, limits=None):
    """A model by name: from the cache, else (where this server allows it) downloaded first."""
    limits = limits or LIMITS
    repo, revision = parse(name)
    snapshot = cached_snapshot(repo, revision)
    if snapshot is None:
        if not limits.hub:
            raise ValueError(
                f"{name!r} is not in the Hugging Face cache (HF_HUB_CACHE) and this server does not download "
                f"models (ATTNVIZ_HUB is off): fetch it into the cache where there is a network "
                f"(`hf download {repo}{' --revision ' + revision if revision else ''} --include '*.safetensors' "
                f"'*.json'`) or ask the operator to allow it")
        snapshot = download(plan(name, limits))
    check_snapshot(snapshot, name, limits)
    return load_dir(snapshot, key=key or name, source=f"{repo} at {snapshot.name[:12]} (Hugging Face cache)",
                    name=name, limits=limits)


def cached_models(limits=None) -> list[tuple[str, str]]:
    """(name, task) of every model in the cache that could load: a snapshot with config.json of a
    supported architecture and safetensors weights; "org/name" for main, "org/name@ref" for other
    refs, "org/name@commit" for a snapshot no ref names."""
    try:
        info = scan_cache_dir(cache_dir())
    except (CacheNotFound, OSError, ValueError):
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or NAME.fullmatch(repo.repo_id) is None:
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
            files = {f.file_name for f in rev.files}
            if "config.json" not in files or not any(f.endswith(".safetensors") for f in files):
                continue
            try:
                config = Folder(Path(rev.snapshot_path), repo.repo_id, limits or LIMITS).read_json("config.json")
                task = hf_family(config.get("model_type"), FOLDER_TASKS).TASK
            except ValueError:
                continue
            refs = sorted(rev.refs, key=lambda r: (r != "main", r)) or [rev.commit_hash]
            out += [(repo.repo_id if ref == "main" else f"{repo.repo_id}@{ref}", task) for ref in refs]
            if len(out) >= MAX_LISTED:
                return out[:MAX_LISTED]
    return out


# ---------------------------------------------------------------- downloading (the operator's choice)
def allowed(repo: str, limits=None) -> bool:
    """Whether `repo` matches one of ATTNVIZ_HUB_ALLOW's patterns (case-insensitive: the Hub's names are)."""
    patterns = [p.strip().lower() for p in (limits or LIMITS).hub_allow.split(",") if p.strip()]
    return any(fnmatch.fnmatchcase(repo.lower(), p) for p in patterns)


@dataclass(frozen=True)
class Plan:
    """What a download fetches: the files (name -> bytes) of one commit, sized before it starts."""
    name: str
    repo: str
    revision: str | None
    commit: str
    files: dict
    weight_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    def describe(self) -> str:
        return (f"{size_text(self.weight_bytes)} of safetensors weights and {len(self.files)} files in all "
                f"({size_text(self.total_bytes)}) at commit {self.commit[:12]}")


def _hub_call(name: str, call):
    """A Hub request; every failure a ValueError that says what to do."""
    try:
        return call()
    except OfflineModeIsEnabled:
        raise ValueError(f"{name!r} cannot be looked up: HF_HUB_OFFLINE is set for this server; unset it "
                         "(HF_HUB_OFFLINE=0) to let ATTNVIZ_HUB download") from None
    except GatedRepoError:
        raise ValueError(f"{name!r} is gated: accept its licence on the Hub and give this server a token "
                         "(HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ValueError(f"{name!r}: the Hub has no such revision (a branch, tag or commit hash)") from None
    except RepositoryNotFoundError:
        raise ValueError(f"{name!r} is not a model on the Hub (or it is private)") from None
    except (JobCancelled, ValueError):
        raise
    except Exception as err:  # network, HTTP, disk: the reason, never a traceback
        raise ValueError(f"{name!r}: the Hub could not be reached or the transfer failed "
                         f"({type(err).__name__}: {str(err)[:160]}); try again later") from None


def plan(name: str, limits=None) -> Plan:
    """Size a download from the Hub's file metadata, refusing (ValueError) before any byte is fetched:
    downloads off, a name not on the allow-list, a repo that needs its own code, an unsupported
    architecture, no safetensors weights, a text model without tokenizer.json (or opus-mt's source.spm,
    target.spm and vocab.json), a file whose size the Hub does not give, weights over
    ATTNVIZ_MAX_WEIGHT_BYTES, or too little disk."""
    limits = limits or LIMITS
    repo, revision = parse(name)
    if not limits.hub:
        raise ValueError("this server does not download models (ATTNVIZ_HUB is off)")
    if not allowed(repo, limits):
        raise ValueError(f"{repo!r} is not on this server's download allow-list (ATTNVIZ_HUB_ALLOW: "
                         f"{limits.hub_allow.strip() or 'empty'})")
    info = _hub_call(name, lambda: HfApi().model_info(repo, revision=revision, files_metadata=True))
    commit = str(getattr(info, "sha", "") or "")
    if not COMMIT.fullmatch(commit):
        raise ValueError(f"{name!r}: the Hub did not give the commit of this revision; not downloading")
    config = getattr(info, "config", None) or {}
    refuse_remote_code(config, name)
    refuse_remote_code(config.get("tokenizer_config") or {}, name, "tokenizer_config.json")
    if "custom_code" in (getattr(info, "tags", None) or []):
        raise ValueError(f"{name!r} is tagged custom_code: it needs the repo's own code, which attnviz never runs")
    task = hf_family(config.get("model_type"), FOLDER_TASKS).TASK
    sizes = {s.rfilename: s.size for s in getattr(info, "siblings", None) or []}
    weights = sorted(f for f in sizes if WEIGHTS.fullmatch(f))
    if not weights:
        pickles = sorted(f for f in sizes if "/" not in f and f.endswith(PICKLES))
        raise ValueError(f"{name!r} has no safetensors weights (model.safetensors)"
                         + (f", only pickle files ({', '.join(pickles[:3])}), which attnviz never loads from "
                            "the Hub" if pickles else ""))
    if "config.json" not in sizes:
        raise ValueError(f"{name!r} has no config.json")
    two_sided = all(f in sizes for f in TWO_SIDED_TOKENIZER_FILES)
    if task in TEXT_TASKS and "tokenizer.json" not in sizes and not two_sided:
        raise ValueError(f"{name!r} has no tokenizer.json (nor an opus-mt tokenizer: "
                         f"{', '.join(TWO_SIDED_TOKENIZER_FILES)}), which models by name read their tokenizer from")
    tokenizer = TWO_SIDED_TOKENIZER_FILES if two_sided and "tokenizer.json" not in sizes else ()
    files = {f: sizes[f] for f in weights + [f for f in SMALL_FILES + tokenizer if f in sizes]}
    unknown = [f for f, n in files.items() if type(n) is not int or n < 0]
    if unknown:
        raise ValueError(f"{name!r}: the Hub did not say how large {unknown[0]} is; not downloading")
    weight_bytes = sum(files[f] for f in weights)
    if weight_bytes > limits.max_weight_bytes:
        raise ValueError(f"{name!r}: its weights hold {size_text(weight_bytes)}, over this server's "
                         f"{size_text(limits.max_weight_bytes)} limit (ATTNVIZ_MAX_WEIGHT_BYTES); nothing was downloaded")
    for f in files:
        if f not in weights:
            bound = MAX_TOKENIZER_BYTES if f in TOKENIZER_FILES else limits.max_config_bytes
            if files[f] > bound:
                raise ValueError(f"{name!r}: {f} is {size_text(files[f])}, over the {size_text(bound)} limit")
    result = Plan(name, repo, revision, commit, files, weight_bytes)
    free = _free_bytes(cache_dir())
    if free is not None and result.total_bytes > free:
        raise ValueError(f"{name!r}: the download needs {size_text(result.total_bytes)} and the cache's disk has "
                         f"{size_text(free)} free")
    return result


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):  # the cache may not exist yet: its nearest existing parent
        if folder.is_dir():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def progress_bars(report, cancel):
    """A tqdm class for snapshot_download: it prints nothing, reports the bytes so far (the larger of
    the bytes received and the bytes written, over every file) and stops the download at its next
    report once `cancel` is set (a `base.jobs.Cancel`)."""
    counts, lock = {}, threading.Lock()

    class Bars(hf_tqdm):
        def __init__(self, *args, **kwargs):
            self.counts_bytes = kwargs.get("unit") == "B"
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if cancel is not None:
                cancel.check()
            if self.counts_bytes and report is not None:
                with lock:
                    counts[id(self)] = counts.get(id(self), 0) + int(n or 0)
                    done = max(counts.values())
                report(done)
    return Bars


def download(p: Plan, progress=None, cancel=None) -> Path:
    """Fetch exactly `p.files` at `p.commit` into the cache (resuming what an earlier, stopped
    download left) and return the snapshot folder. `progress(done_bytes, total_bytes)` is called
    from the download's threads; `cancel.check()` (a `base.jobs.Cancel`) stops it, raising
    JobCancelled. The branch asked for (main by default) is then recorded in refs/, the way
    huggingface_hub records it, so the model loads offline by the same name."""
    total = p.total_bytes
    report = None if progress is None else (lambda done: progress(min(done, total), total))
    patterns = [glob.escape(f) for f in p.files]   # exact names: nothing else of the repo is fetched
    found = _hub_call(p.name, lambda: snapshot_download(
        p.repo, revision=p.commit, cache_dir=str(cache_dir()), allow_patterns=patterns,
        tqdm_class=progress_bars(report, cancel), max_workers=4))
    if cancel is not None:
        cancel.check()
    ref = p.revision or "main"
    if not COMMIT.fullmatch(ref):
        refs = repo_dir(p.repo) / "refs" / ref
        try:   # written whole or not at all: a reader never sees half a commit
            refs.parent.mkdir(parents=True, exist_ok=True)
            tmp = refs.with_name(refs.name + ".tmp")
            tmp.write_text(p.commit)
            os.replace(tmp, refs)
        except OSError as err:
            raise ValueError(f"{p.name!r} was downloaded but its branch could not be recorded in the cache "
                             f"({err.strerror or type(err).__name__}); load it by its commit, @{p.commit}") from None
    if progress is not None:
        progress(total, total)
    snapshot = cached_snapshot(p.repo, p.commit)
    if snapshot is None or Path(found).name != p.commit:
        raise ValueError(f"{p.name!r}: the download finished but the cache holds no complete snapshot; try again")
    return snapshot


def cached_key(name: str) -> str | None:
    """The name at its cached commit, "org/name@<commit>", when `name` is in the cache (the app
    keeps a loaded model under it, so a branch that moves gives a new entry); None otherwise."""
    repo, revision = parse(name)
    snapshot = cached_snapshot(repo, revision)
    return None if snapshot is None else f"{repo}@{snapshot.name}"
