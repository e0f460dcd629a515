"""ddl-data prepare on several workers: the same bytes whatever their number, a kill at any point resumed
with no token lost or written twice, the progress line; FineWeb-Edu from local parquet; the loader's windows."""

import json
import multiprocessing
import os
import random
import re
import signal
import time

import numpy as np
import psutil
import pytest
import torch

import ddl.data.dataset as dataset
from ddl.data import BatchLoader, DataConfig, open_dataset, prepare
from ddl.data.bench import write_fineweb_parquet
from ddl.data.sources import embedded_documents, units
from tests.conftest import run_cli

SHARD_TOKENS = 20_000     # many shards from a small corpus: their boundaries are what a resume must get right


def _words() -> list[str]:
    return " ".join(embedded_documents()).split()


def make_corpus(directory, n_docs: int = 600, seed: int = 0):
    """English-like documents (the manual's words, shuffled) as .txt files, a .jsonl file and FineWeb-Edu parquet
    files of small row groups; returns the glob of all of them."""
    rng, words = random.Random(seed), _words()
    docs = [" ".join(rng.choices(words, k=rng.randint(150, 900))) for _ in range(n_docs)]
    directory.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs[:20]):
        (directory / f"a{i:02d}.txt").write_text(doc)
    (directory / "b.jsonl").write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs[20:80]))
    write_fineweb_parquet(directory / "fineweb", docs[80:], rows_per_file=200, row_group_size=40)
    return str(directory / "**" / "*.*")


def dataset_files(path) -> dict[str, bytes]:
    """Every file the dataset has, but the record of which shards were verified (open_dataset's)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != dataset.VERIFIED}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_the_same_shards_and_manifest_whatever_the_number_of_workers(corpus, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "SHARD_TOKENS", SHARD_TOKENS)
    cfg = DataConfig(source="files", files=corpus, tokenizer=tokenizer, bpe_vocab=512)
    assert len(units(cfg)) > 8                                  # work for both workers
    one = prepare(cfg, root=tmp_path / "one", progress=False, workers=1)
    two = prepare(cfg, root=tmp_path / "two", progress=False, workers=2)
    files = dataset_files(one)
    assert files == dataset_files(two)
    manifest = json.loads(files["manifest.json"])
    assert len(manifest["splits"]["train"]["shards"]) >= 4 and manifest["splits"]["val"]["docs"] > 0
    assert sum(manifest["splits"][s]["docs"] for s in ("train", "val")) == 600
    if tokenizer == "bpe":                                      # the batched encode is the tokenizer's own encode
        ds = open_dataset(one)
        first = next(d for d in _first_docs(corpus) if not dataset.is_val(d, cfg.val_fraction))
        tokens = ds.train.concatenated()
        assert tokens[: np.argmax(tokens == 0)].tolist() == ds.tokenizer().encode(first)


def _first_docs(corpus):
    from ddl.data.sources import documents
    return documents(DataConfig(source="files", files=corpus))


def _prepare_in_child(cfg, root, shard_tokens, record_every_s):
    dataset.SHARD_TOKENS, dataset.RECORD_EVERY_S = shard_tokens, record_every_s
    prepare(cfg, root=root, progress=False, workers=2)


@pytest.mark.slow
@pytest.mark.parametrize("shard_tokens, record_every_s", [(SHARD_TOKENS, 60.0), (dataset.SHARD_TOKENS, 0.0)],
                         ids=["at-a-shard", "between-shards"])
def test_a_two_worker_prepare_killed_mid_way_resumes_to_the_same_bytes(corpus, shard_tokens, record_every_s, tmp_path,
                                                                       monkeypatch, capfd):
    """SIGKILL to a 2-worker prepare once it has recorded its position (with a shard; or between shards, its
    buffers saved): its workers exit with it, the lock goes with the process, and the prepare run again
    resumes there: the same bytes as a build never interrupted."""
    cfg = DataConfig(source="files", files=corpus, tokenizer="bpe", bpe_vocab=512)
    root = tmp_path / "killed"
    progress = root / f"{cfg.dataset_name()}.partial" / dataset.PROGRESS
    child = multiprocessing.get_context("spawn").Process(target=_prepare_in_child,
                                                         args=(cfg, root, shard_tokens, record_every_s))
    child.start()
    deadline = time.monotonic() + 120
    while not progress.is_file() and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    started = psutil.Process(child.pid).children()              # the pool's workers (and what multiprocessing
    commands = [" ".join(p.cmdline()) for p in started]         # may start beside them)
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert sum("spawn_main" in command for command in commands) == 2
    gone, alive = psutil.wait_procs(started, timeout=120)       # they notice their parent is gone (within a
    #                                                             second of running; a loaded machine starts them late)
    assert not alive
    state = json.loads(progress.read_text())
    assert state["docs_done"] > 0 and not state["finished"]
    assert bool(state["pending"]["train"]) == (shard_tokens > SHARD_TOKENS)      # what the resume starts from
    monkeypatch.setattr(dataset, "SHARD_TOKENS", shard_tokens)
    resumed = prepare(cfg, root=root, progress=True, workers=2)
    assert f"resuming {cfg.dataset_name()} at document {state['docs_done']:,}" in capfd.readouterr().err
    fresh = prepare(cfg, root=tmp_path / "fresh", progress=False, workers=1)
    assert dataset_files(resumed) == dataset_files(fresh)
    assert not list(resumed.glob("pending_*"))


def test_the_progress_line_shows_tokens_per_second_and_the_eta(corpus, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("DDL_PROGRESS_S", "0.001")              # off a terminal: a line at every unit
    monkeypatch.setenv("DDL_HOME", str(tmp_path))
    out = run_cli("ddl-data", "prepare", "--source", "files", "--files", corpus, "--tokenizer", "byte",
                  "--workers", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    progress = [line for line in lines if " tokenizing files-byte-" in line]
    assert len(progress) > 3 and all(re.search(r" tok/s on 2 workers, ETA \d\d:\d\d:\d\d$", line) for line in progress)
    assert lines[-1].startswith("tokenized files-byte-") and " tok/s on 2 workers" in lines[-1]
    assert "train" in out.stdout and "unigram cross-entropy" in out.stdout


def test_the_loader_reads_the_windows_it_always_read(tmp_path):
    """A batch is copied from strided views, one copy per shard: the same windows as slicing each row from
    its shard (what the loader did before, and what checkpoints of earlier runs resume into)."""
    from ddl.data.dataset import Split
    shards = []
    for i, size in enumerate([5000, 300, 7000]):
        np.arange(i * 10_000, i * 10_000 + size, dtype=np.uint16).tofile(tmp_path / f"s{i}.bin")
        shards.append({"file": f"s{i}.bin", "tokens": size})
    split = Split(tmp_path, {"shards": shards, "tokens": 12_300})
    loader = BatchLoader(split, 8, 512, seed=5, rank=1, world_size=2)
    rng = np.random.Generator(np.random.PCG64(5))
    starts = np.cumsum([max(s["tokens"] - 512, 0) for s in shards])
    for _ in range(20):
        mine = rng.integers(0, starts[-1], size=16)[8:]
        ids = np.searchsorted(starts, mine, side="right")
        offsets = mine - np.concatenate(([0], starts))[ids]
        expected = torch.from_numpy(np.stack([split.shards[s][o:o + 513] for s, o in zip(ids, offsets, strict=True)])
                                    .astype(np.int64))
        x, y = loader.next_batch()
        assert torch.equal(x, expected[:, :-1]) and torch.equal(y, expected[:, 1:]) and x.dtype == torch.int64


# -- FineWeb-Edu from local parquet (data=fineweb_edu data.fineweb_name=<glob>) ------------------------------
@pytest.fixture(scope="module")
def fineweb(tmp_path_factory):
    """A small FineWeb-Edu in its real schema: 3 parquet files of 100 rows, row groups of 25."""
    rng, words = random.Random(1), _words()
    directory = tmp_path_factory.mktemp("fineweb")
    write_fineweb_parquet(directory, (" ".join(rng.choices(words, k=rng.randint(200, 600))) for _ in range(300)),
                          rows_per_file=100, row_group_size=25)
    return directory


@pytest.mark.slow
def test_fineweb_edu_from_a_local_parquet_glob_trains_a_micro_model(fineweb, ddl_home):
    from tests.conftest import mlflow_runs
    glob = str(fineweb / "*.parquet")
    out = run_cli("ddl-run", "model=micro", "train=smoke", "data=fineweb_edu", f"data.fineweb_name={glob}",
                  "data.tokenizer=bpe", "data.bpe_vocab=512", "data.val_fraction=0.1", "data.fineweb_tokens=60000",
                  "experiment=fineweb_local")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [run] = mlflow_runs("fineweb_local")
    assert run.info.status == "FINISHED" and run.data.params["data.source"] == "fineweb_edu"
    [built] = (ddl_home / "data").glob("fineweb_edu-bpe-*/")
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["source"]["name"] == glob
    assert 60_000 <= manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"] < 61_000   # budget


def _other_column(path, _good: bytes):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"content": ["a lesson about plants " * 30], "id": ["<urn:1>"], "score": [3.0]}), path)


def _cut_short(path, good: bytes):
    path.write_bytes(good[: len(good) // 2])           # a download that stopped half-way


def _bad_fineweb(fineweb, directory, bad) -> tuple[str, str]:
    """Two good files of the set and a bad one beside them (or none at all): (glob, the bad file's prefix)."""
    if bad is None:
        return str(directory / "*.parquet"), ""      # an empty folder
    for source in sorted(fineweb.glob("*.parquet"))[:2]:
        (directory / source.name).write_bytes(source.read_bytes())
    bad(directory / "001_99999.parquet", source.read_bytes())
    return str(directory / "*.parquet"), f"{directory / '001_99999.parquet'}: "


@pytest.mark.parametrize("bad, message", [
    (_other_column, "no 'text' column (its columns: content, id, score)"),
    (_cut_short, "Parquet magic bytes not found in footer"),
    (None, "matches no file"),
])
def test_each_bad_local_fineweb_input_is_one_line_naming_the_file_and_leaves_nothing(fineweb, bad, message, tmp_path):
    (tmp_path / "in").mkdir()
    glob, shown = _bad_fineweb(fineweb, tmp_path / "in", bad)
    with pytest.raises(ValueError) as refused:
        prepare(DataConfig(source="fineweb_edu", fineweb_name=glob, tokenizer="bpe"), root=tmp_path / "data",
                progress=False)
    assert str(refused.value).startswith(f"data.fineweb_name='{glob}': {shown}{message}")
    assert "\n" not in str(refused.value) and not any((tmp_path / "data").iterdir())


def test_a_damaged_fineweb_file_stops_ddl_run_in_one_line_and_leaves_nothing(fineweb, ddl_home, tmp_path_factory):
    from tests.test_hostile import assert_nothing_created, assert_one_line
    glob, shown = _bad_fineweb(fineweb, tmp_path_factory.mktemp("bad_fineweb"), _cut_short)
    out = run_cli("ddl-run", "model=micro", "train=smoke", "data=fineweb_edu", f"data.fineweb_name={glob}",
                  "data.tokenizer=byte")
    assert_one_line(out, "ddl-run: error: ", f"data.fineweb_name='{glob}': {shown}Parquet magic bytes not found")
    assert_nothing_created(ddl_home)


@pytest.mark.slow
def test_the_data_bench_measures_each_tokenizer_on_one_and_two_workers(tmp_path, monkeypatch):
    """python -m ddl.data.bench on a small corpus: a row per tokenizer and worker count, the same manifest on
    both, GPT-2's absence said (no network here) and its stand-in measured, the loader's ms per batch."""
    from ddl.data.bench import main
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "no-tiktoken-cache"))
    assert main(["--mb", "1", "--tokenizers", "byte,bpe,gpt2", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "prepare.json").read_text())
    tokenizers = result["prepare"]["tokenizers"]
    assert [r["workers"] for r in tokenizers["bpe"]["runs"]] == [1, 2] and tokenizers["bpe"]["same_manifest"]
    assert tokenizers["byte"]["same_manifest"] and tokenizers["byte"]["runs"][0]["tokens"] > 900_000
    assert "not cached" in tokenizers["gpt2"]["absent"] and tokenizers["gpt2"]["standin"]["tokens"] > 0
    assert all(entry["projection"]["hours"]["64"] < entry["projection"]["hours"]["1"] for entry in tokenizers.values())
    assert set(result["loader"]) == {"cpu B=16", "cpu B=24"}
    text = (tmp_path / "out" / "prepare.md").read_text()
    assert "| bpe | 2 |" in text and "50B on 64 cores (h)" in text and "gpt2 stand-in (tiktoken" in text


def test_a_prepare_killed_mid_way_whose_glob_gained_a_file_builds_the_new_glob_afresh(tmp_path, monkeypatch, capfd):
    """A resume never splices two sources: a build killed mid-way, a file then added to its glob, is built again
    from the start (the line names the file), to the bytes of a clean build of the new glob."""
    corpus = make_corpus(tmp_path / "corpus", n_docs=300)
    cfg = DataConfig(source="files", files=corpus, tokenizer="byte")
    root = tmp_path / "killed"
    progress = root / f"{cfg.dataset_name()}.partial" / dataset.PROGRESS
    child = multiprocessing.get_context("spawn").Process(target=_prepare_in_child,
                                                         args=(cfg, root, SHARD_TOKENS, 60.0))
    child.start()
    deadline = time.monotonic() + 120
    while not progress.is_file() and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert not json.loads(progress.read_text())["finished"]
    added = tmp_path / "corpus" / "a00b.txt"                    # listed among the first files: before the kill's
    added.write_text(" ".join(_words()[:400]))                  # position, which a splice would skip
    monkeypatch.setattr(dataset, "SHARD_TOKENS", SHARD_TOKENS)
    rebuilt = prepare(cfg, root=root, progress=False, workers=2)
    assert (f"ddl-data: {cfg.dataset_name()}: 1 file added ({added}) since its interrupted build; building it afresh"
            in capfd.readouterr().err)
    fresh = prepare(cfg, root=tmp_path / "fresh", progress=False, workers=1)
    assert dataset_files(rebuilt) == dataset_files(fresh)
    assert json.loads(dataset_files(rebuilt)["manifest.json"])["fingerprint"]["files"] == 24
