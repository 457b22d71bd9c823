"""Models by name: read from a Hugging Face cache laid out in tmp_path (offline), and downloads planned
from the Hub's file metadata, with the Hub's calls replaced by stand-ins (no network here)."""
import fnmatch
import os
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.hf_api import ModelInfo

import attnviz
from attnviz.base import jobs
from attnviz.weights import hub
from tests import hub_cache
from tests.hub_cache import MAIN, OTHER
from tests.test_parity import close, reference


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty HF cache that this test's process reads; no Hub call may happen unless a test allows it."""
    return hub_cache.offline_for_test(monkeypatch, tmp_path / "hf" / "hub")


def cached_model(cache, tmp_path, repo="org/tiny", family="gpt2", commit=MAIN, refs=("main",), shift=0.0,
                 change=None):
    src = tmp_path / f"src-{repo.replace('/', '_')}-{commit[:4]}"
    hf = hub_cache.model_folder(src, family, shift)
    if change:
        change(src)
    hub_cache.lay_out(cache, repo, src, commit, refs)
    return hf


def same_outputs(ours, hf):
    ids = torch.tensor(hub_cache.tokenizer()("the cat sat on the mat")["input_ids"])
    hidden, att, logits = reference(hf, ids)
    tr = ours.trace("the cat sat on the mat")            # tokenized by the repo's tokenizer.json
    assert tr.tokens == ["the", "cat", "sat", "on", "the", "mat"]
    close(tr.attentions, att)
    close(tr.logits, logits[0])


# ---------------------------------------------------------------- the cache, offline
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_cached_model_loads_by_name_and_matches_transformers(cache, tmp_path, family):
    hf = cached_model(cache, tmp_path, family=family)
    model = attnviz.load_model("org/tiny")
    assert model.info.key == "org/tiny" and "Hugging Face cache" in model.info.source
    same_outputs(model, hf)


def test_revisions_are_branches_in_refs_or_commit_hashes(cache, tmp_path):
    main = cached_model(cache, tmp_path)
    dev = cached_model(cache, tmp_path, commit=OTHER, refs=("dev",), shift=0.01)
    same_outputs(attnviz.load_model("org/tiny"), main)
    same_outputs(attnviz.load_model("org/tiny@main"), main)
    same_outputs(attnviz.load_model("org/tiny@dev"), dev)
    same_outputs(attnviz.load_model(f"org/tiny@{OTHER}"), dev)
    with pytest.raises(ValueError, match="not in the Hugging Face cache"):
        attnviz.load_model("org/tiny@nope")
    with pytest.raises(ValueError, match="not in the Hugging Face cache"):
        attnviz.load_model("org/tiny@" + "f" * 40)


def test_hf_home_places_the_cache_too(cache, tmp_path, monkeypatch):
    cached_model(cache, tmp_path)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(cache.parent))
    assert attnviz.load_model("org/tiny").info.key == "org/tiny"


def test_a_name_not_in_the_cache_is_refused_without_a_hub_call_when_downloads_are_off(cache):
    with pytest.raises(ValueError, match="not in the Hugging Face cache.*ATTNVIZ_HUB is off"):
        attnviz.load_model("org/missing")


@pytest.mark.parametrize("name", ["../x", "a/b/c", "", "org/", "org/name@", "org/na..me", "org--x/y",
                                  "org/name@../../../etc", "org/name@a//b", "-org/name", "org/name@dev/"])
def test_malformed_names_are_value_errors(cache, name):
    with pytest.raises(ValueError, match="not a Hugging Face model name"):
        hub.parse(name)
    with pytest.raises(ValueError):
        attnviz.load_model(name)


def test_malformed_names_through_load_model_say_what_to_write(cache):
    with pytest.raises(ValueError, match="org/name or org/name@revision"):
        attnviz.load_model("a/b/c")
    with pytest.raises(ValueError, match="Hugging Face name"):
        attnviz.load_model("  ")


def test_pickle_only_weights_are_refused_and_never_opened(cache, tmp_path, monkeypatch):
    def to_bin(folder):
        state = load_safetensors(folder / "model.safetensors")
        (folder / "model.safetensors").unlink()
        torch.save(state, folder / "pytorch_model.bin")
    cached_model(cache, tmp_path, change=to_bin)

    def never(*args, **kwargs):
        raise AssertionError("a pickle was opened")
    monkeypatch.setattr(torch, "load", never)
    with pytest.raises(ValueError, match=r"only pickle weights \(pytorch_model.bin\)"):
        attnviz.load_model("org/tiny")
    assert hub.cached_models() == []


def load_safetensors(path):
    from safetensors.torch import load_file
    return load_file(str(path))


def test_a_config_asking_for_remote_code_is_refused(cache, tmp_path):
    cached_model(cache, tmp_path, change=lambda f: hub_cache.edit_config(
        f, auto_map={"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}))
    with pytest.raises(ValueError, match="auto_map: AutoModelForCausalLM -> modeling_tiny.TinyForCausalLM.*never runs"):
        attnviz.load_model("org/tiny")


def test_a_cached_file_leading_outside_its_repo_is_refused(cache, tmp_path):
    cached_model(cache, tmp_path)
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    (cache / "models--org--tiny" / "snapshots" / MAIN / "generation_config.json").unlink()
    (cache / "models--org--tiny" / "snapshots" / MAIN / "generation_config.json").symlink_to(outside)
    with pytest.raises(ValueError, match="leads outside this model's cache folder"):
        attnviz.load_model("org/tiny")


def test_cached_weights_over_the_bound_are_refused(cache, tmp_path, set_limits):
    cached_model(cache, tmp_path)
    set_limits(max_weight_bytes=10_000)
    with pytest.raises(ValueError, match="ATTNVIZ_MAX_WEIGHT_BYTES"):
        attnviz.load_model("org/tiny")


def test_cached_models_lists_what_could_load(cache, tmp_path):
    assert hub.cached_models() == []                        # no cache folder at all
    cached_model(cache, tmp_path, refs=("main", "dev"))
    cached_model(cache, tmp_path, repo="org/enc", family="bert")
    cached_model(cache, tmp_path, repo="org/detached", commit=OTHER, refs=())
    cached_model(cache, tmp_path, repo="org/odd", change=lambda f: hub_cache.edit_config(f, model_type="mamba"))
    assert hub.cached_models() == [(f"org/detached@{OTHER}", "lm"), ("org/enc", "encoder"),
                                   ("org/tiny", "lm"), ("org/tiny@dev", "lm")]


# ---------------------------------------------------------------- downloads (the Hub replaced)
def hub_info(files: dict, sha=MAIN, **config):
    tags = config.pop("tags", [])
    return ModelInfo(id="Qwen/tiny", sha=sha, siblings=[{"rfilename": f, "size": n} for f, n in files.items()],
                     config={"model_type": "gpt2", **config}, tags=tags)


@pytest.fixture
def online(cache, monkeypatch, set_limits):
    """Downloads on for Qwen/*; `online(files, **config)` makes the Hub answer with that metadata and
    returns the list of snapshot_download calls."""
    set_limits(hub=True, hub_allow="Qwen/*, other/exact")
    calls = []

    def install(files, sha=MAIN, fetch=None, **config):
        class Api:
            def model_info(self, repo, revision=None, files_metadata=False):
                assert files_metadata
                return hub_info(files, sha, **config)
        monkeypatch.setattr(hub, "HfApi", Api)

        def snapshot_download(repo, **kwargs):
            calls.append((repo, kwargs))
            return fetch(repo, **kwargs)
        monkeypatch.setattr(hub, "snapshot_download", snapshot_download)
        return calls
    return install


SIZES = {"config.json": 900, "model.safetensors": 100_000, "tokenizer.json": 2_000, "tokenizer_config.json": 300,
         "pytorch_model.bin": 100_000, "modeling_tiny.py": 500, "onnx/model.onnx": 90_000, "README.md": 10}


def test_a_repo_not_on_the_allow_list_is_refused_before_any_hub_call(online):
    with pytest.raises(ValueError, match="not on this server's download allow-list"):
        attnviz.load_model("evil/tiny")   # the cache fixture fails any Hub call


def test_weights_over_the_bound_are_refused_before_a_byte_is_downloaded(online, set_limits):
    calls = online({**SIZES, "model.safetensors": 9 * 2**30})
    with pytest.raises(ValueError, match=r"9.0 GiB, over this server's 8.0 GiB limit .*nothing was downloaded"):
        attnviz.load_model("Qwen/tiny")
    set_limits(max_weight_bytes=50_000)
    calls = online({**SIZES, "model-00001-of-00002.safetensors": 30_000, "model-00002-of-00002.safetensors": 30_000,
                    "model.safetensors.index.json": 500})
    with pytest.raises(ValueError, match="ATTNVIZ_MAX_WEIGHT_BYTES"):
        hub.plan("Qwen/tiny")
    assert calls == []


@pytest.mark.parametrize("files, config, match", [
    ({**SIZES, "model.safetensors": None}, {}, "did not say how large model.safetensors is"),
    ({k: v for k, v in SIZES.items() if k != "model.safetensors"}, {}, r"only pickle files \(pytorch_model.bin\)"),
    ({k: v for k, v in SIZES.items() if k != "tokenizer.json"}, {}, "no tokenizer.json"),
    (SIZES, {"auto_map": {"AutoModel": "modeling_tiny.Tiny"}}, "own code"),
    (SIZES, {"tokenizer_config": {"auto_map": {"AutoTokenizer": ["tok.Tok", None]}}}, "tokenizer_config.json asks"),
    (SIZES, {"tags": ["custom_code"]}, "custom_code"),
    (SIZES, {"model_type": "mamba"}, "architecture 'mamba' is not supported"),
])
def test_what_a_download_plan_refuses(online, files, config, match):
    calls = online(files, **config)
    with pytest.raises(ValueError, match=match):
        attnviz.load_model("Qwen/tiny")
    assert calls == []


def test_an_opus_mt_repo_is_planned_with_its_two_sided_tokenizer_and_refused_without_one(online):
    """opus-mt repos carry source.spm, target.spm and vocab.json instead of tokenizer.json."""
    marian = {k: v for k, v in SIZES.items() if k != "tokenizer.json"}
    spm = {"source.spm": 800_000, "target.spm": 800_000, "vocab.json": 1_500_000, "README.md": 10}
    online({**marian, **spm}, model_type="marian")
    plan = hub.plan("Qwen/tiny")
    assert sorted(plan.files) == ["config.json", "model.safetensors", "source.spm", "target.spm",
                                  "tokenizer_config.json", "vocab.json"]
    for missing in spm:   # all three are needed; without them it is refused by name
        if missing != "README.md":
            online({**marian, **{k: v for k, v in spm.items() if k != missing}}, model_type="marian")
            with pytest.raises(ValueError, match="no tokenizer.json \\(nor an opus-mt tokenizer: source.spm, "
                                                 "target.spm, vocab.json\\)"):
                hub.plan("Qwen/tiny")
    online({**marian, **spm, "source.spm": 65 * 2**20}, model_type="marian")
    with pytest.raises(ValueError, match="source.spm is 65.0 MiB, over the 64.0 MiB limit"):
        hub.plan("Qwen/tiny")


def test_downloads_off_or_offline_say_so(online, monkeypatch, set_limits):
    class Offline:
        def model_info(self, *args, **kwargs):
            raise OfflineModeIsEnabled("offline")
    monkeypatch.setattr(hub, "HfApi", Offline)
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        attnviz.load_model("Qwen/tiny")
    set_limits(hub=False)
    with pytest.raises(ValueError, match="does not download models"):
        hub.plan("Qwen/tiny")


def fake_download(cache, src, progress_steps=3):
    """A stand-in for snapshot_download: lays out the files its patterns name, reporting progress
    through its tqdm class as the real one does."""
    def fetch(repo, revision, cache_dir, allow_patterns, tqdm_class, **kwargs):
        assert Path(cache_dir) == cache
        names = sorted(p.name for p in src.iterdir() if any(fnmatch.fnmatch(p.name, a) for a in allow_patterns))
        bar = tqdm_class(total=100, unit="B")
        for _ in range(progress_steps):
            bar.update(10)
        hub_cache.lay_out(cache, repo, src_only(src, names), revision, refs=())
        return str(cache / ("models--" + repo.replace("/", "--")) / "snapshots" / revision)
    return fetch


def src_only(src, names):
    out = src.parent / (src.name + "-fetched")
    out.mkdir()
    for n in names:
        (out / n).write_bytes((src / n).read_bytes())
    return out


def test_a_download_fetches_only_the_sized_files_then_loads_offline(online, cache, tmp_path, set_limits):
    src = tmp_path / "src"
    hf = hub_cache.model_folder(src)
    (src / "pytorch_model.bin").write_bytes(b"never fetched")
    (src / "modeling_tiny.py").write_text("raise SystemExit")
    files = {p.name: p.stat().st_size for p in src.iterdir()}
    calls = online(files, fetch=fake_download(cache, src))
    seen = []
    plan = hub.plan("Qwen/tiny")
    assert plan.commit == MAIN and plan.weight_bytes == files["model.safetensors"]
    snapshot = hub.download(plan, progress=lambda done, total: seen.append((done, total)))
    [(repo, kwargs)] = calls
    assert repo == "Qwen/tiny" and kwargs["revision"] == MAIN       # the commit that was sized
    assert sorted(kwargs["allow_patterns"]) == ["config.json", "generation_config.json", "model.safetensors",
                                                "tokenizer.json", "tokenizer_config.json"]
    assert seen[:3] == [(10, plan.total_bytes), (20, plan.total_bytes), (30, plan.total_bytes)]
    assert seen[-1] == (plan.total_bytes, plan.total_bytes)
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(kwargs["allow_patterns"])
    assert (cache / "models--Qwen--tiny" / "refs" / "main").read_text() == MAIN
    set_limits(hub=False)                                           # later: offline, by the same name
    same_outputs(attnviz.load_model("Qwen/tiny"), hf)
    assert len(calls) == 1


def test_load_model_downloads_where_allowed(online, cache, tmp_path):
    src = tmp_path / "src"
    hf = hub_cache.model_folder(src)
    calls = online({p.name: p.stat().st_size for p in src.iterdir()}, fetch=fake_download(cache, src))
    same_outputs(attnviz.load_model("other/exact"), hf)
    assert len(calls) == 1
    same_outputs(attnviz.load_model("other/exact"), hf)             # the second time from the cache
    assert len(calls) == 1


def test_a_cancelled_download_stops_at_its_next_report(online, cache, tmp_path):
    src = tmp_path / "src"
    hub_cache.model_folder(src)
    online({p.name: p.stat().st_size for p in src.iterdir()}, fetch=fake_download(cache, src))
    cancel = jobs.Cancel()
    seen = []

    def progress(done, total):
        seen.append(done)
        cancel.set()
    with pytest.raises(jobs.JobCancelled):
        hub.download(hub.plan("Qwen/tiny"), progress=progress, cancel=cancel)
    assert seen == [10]
    assert hub.cached_snapshot("Qwen/tiny", None) is None


def test_the_allow_list_matches_whole_names_case_insensitively(set_limits):
    set_limits(hub_allow=" Qwen/* ,meta-llama/Llama-3.2-1B")
    assert hub.allowed("qwen/Qwen2.5-0.5B") and hub.allowed("meta-llama/llama-3.2-1b")
    assert not hub.allowed("meta-llama/Llama-3.2-1B-Instruct") and not hub.allowed("Qwenx/a")
    set_limits(hub_allow="")
    assert not hub.allowed("Qwen/a")


def test_names_and_paths_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "x").mkdir(parents=True)
    assert hub.names_a_repo("org/name") and hub.names_a_repo("org/name@dev")
    assert not hub.names_a_repo("models/x")          # an existing relative folder stays a folder
    assert not any(hub.names_a_repo(p) for p in ("/abs/x", "./x/y", "../x/y", "~/x", "minilm"))
    assert os.path.isdir("models/x")


def test_the_progress_class_works_inside_huggingface_hubs_own_bars_and_thread_map():
    """The real snapshot_download cannot run here (no network): its bars are driven as it drives
    them (a bytes-received bar, a bytes-written bar, a files bar over a thread map)."""
    import logging

    from huggingface_hub.utils.tqdm import _create_progress_bar, hf_thread_map
    from huggingface_hub.utils._xet_progress_reporting import _update_transfer_bar
    seen, cancel = [], jobs.Cancel()
    bars = hub.progress_bars(seen.append, cancel)
    received, written = (_create_progress_bar(cls=bars, log_level=logging.INFO, name=n, desc=n, total=0, initial=0,
                                              unit="B", unit_scale=True) for n in ("received", "written"))

    def one_file(x):
        written.total = (written.total or 0) + 100
        written.update(50)
        _update_transfer_bar(received, 60)
        written.update(50)
        return x
    assert hf_thread_map(one_file, [1, 2, 3], desc="files", max_workers=2, tqdm_class=bars) == [1, 2, 3]
    assert max(seen) == 300 and seen[-1] == 300          # the larger count: bytes written
    cancel.set()
    with pytest.raises(jobs.JobCancelled):
        hf_thread_map(one_file, [1, 2, 3], desc="files", max_workers=2, tqdm_class=bars)
