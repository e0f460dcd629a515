"""Token shards, the loader's determinism and position, the sources and prepare's guarantees."""

import json
import multiprocessing

import numpy as np
import pytest
import torch

from ddl.data import BatchLoader, DataConfig, open_dataset, prepare, val_batches
from ddl.data.cli import main as data_cli
from ddl.data.sources import embedded_documents, is_val


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    return open_dataset(prepare(DataConfig(), root=tmp_path_factory.mktemp("data"), progress=False))


def test_manifest_and_round_trip(embedded):
    m = embedded.manifest
    assert m["dtype"] == "uint16" and m["tokenizer"] == {"name": "byte", "vocab_size": 256, "eot": 0}
    for split in ("train", "val"):
        assert m["splits"][split]["tokens"] == sum(s["tokens"] for s in m["splits"][split]["shards"])
    assert 0.9 < m["bytes_per_token"]["val"] <= 1.0                     # bytes, minus separators
    assert 2.5 < m["unigram_xent_val"] < 4.5
    docs = [d for d in embedded_documents() if is_val(d, 0.1)]
    tokens = embedded.val.concatenated()
    first = tokens[: np.argmax(tokens == 0)]
    assert embedded.tokenizer().decode(first.tolist()) == docs[0]


def test_corrupt_shard_is_detected(tmp_path):
    ds = open_dataset(prepare(DataConfig(), root=tmp_path, progress=False))
    ds.verify()
    shard = ds.path / ds.manifest["splits"]["val"]["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="shard val_0000.bin is damaged: its sha256"):
        ds.verify()


def test_split_is_deterministic_and_disjoint():
    docs = list(embedded_documents())
    val = {d for d in docs if is_val(d, 0.1)}
    assert docs == list(embedded_documents())
    assert 0.05 < len(val) / len(docs) < 0.2 and val.isdisjoint(d for d in docs if not is_val(d, 0.1))


def test_loader_restores_its_exact_position(embedded):
    loader = BatchLoader(embedded.train, 4, 32, seed=7)
    loader.next_batch()
    state = json.loads(json.dumps(loader.state_dict()))   # plain types survive serialisation
    expected = [loader.next_batch() for _ in range(3)]
    other = BatchLoader(embedded.train, 4, 32, seed=999)
    other.load_state_dict(state)
    for x, y in expected:
        x2, y2 = other.next_batch()
        assert torch.equal(x, x2) and torch.equal(y, y2)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_ranks_are_disjoint_and_add_up_to_the_single_process_batch(embedded):
    single = BatchLoader(embedded.train, 8, 16, seed=3).next_batch()[0]
    ranks = [BatchLoader(embedded.train, 4, 16, seed=3, rank=r, world_size=2).next_batch()[0] for r in (0, 1)]
    assert torch.equal(torch.cat(ranks), single) and not torch.equal(ranks[0], ranks[1])


def test_val_batches_are_fixed(embedded):
    a = [x for x, _ in val_batches(embedded.val, 4, 32, max_tokens=32 * 10)]
    b = [x for x, _ in val_batches(embedded.val, 4, 32, max_tokens=32 * 10)]
    assert len(a) == 3 and sum(len(x) for x in a) == 10
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_files_source_reads_txt_jsonl_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    texts = [f"document number {i} " * 40 for i in range(60)]
    (tmp_path / "a.txt").write_text(texts[0])
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[1:30]))
    pq.write_table(pa.table({"text": texts[30:]}), tmp_path / "c.parquet")
    ds = open_dataset(prepare(DataConfig(source="files", files=str(tmp_path / "*")), root=tmp_path / "d",
                              progress=False))
    assert sum(ds.manifest["splits"][s]["docs"] for s in ("train", "val")) == 60


def test_fineweb_path_on_a_local_parquet_with_its_schema(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = {"text": [f"Photosynthesis lesson {i}: plants turn light into sugar. " * 20 for i in range(200)],
            "id": [f"<urn:{i}>" for i in range(200)], "score": [3.1] * 200, "int_score": [3] * 200}
    pq.write_table(pa.table(rows), tmp_path / "fineweb.parquet")
    cfg = DataConfig(source="fineweb_edu", fineweb_name=str(tmp_path / "fineweb.parquet"), fineweb_tokens=50_000)
    m = open_dataset(prepare(cfg, root=tmp_path / "d", progress=False)).manifest
    total = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
    assert 50_000 <= total < 50_000 + 1300                               # stops at the budget
    assert m["source"]["name"].endswith("fineweb.parquet")


def test_bpe_is_trained_on_train_and_round_trips(tmp_path):
    ds = open_dataset(prepare(DataConfig(tokenizer="bpe", bpe_vocab=512), root=tmp_path, progress=False))
    tok = ds.tokenizer()
    text = "The with statement is used to wrap the execution of a block."
    assert tok.decode(tok.encode(text)) == text and len(tok.encode(text)) < len(text)
    assert (ds.path / "tokenizer.json").is_file()
    assert DataConfig(tokenizer="bpe", bpe_vocab=512).model_vocab_size() == 512


def test_gpt2_without_its_bpe_file_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(ValueError, match=r"^data.tokenizer='gpt2': tiktoken's GPT-2 BPE file is not cached"):
        prepare(DataConfig(tokenizer="gpt2"), root=tmp_path, progress=False)
    assert DataConfig(tokenizer="gpt2").model_vocab_size() == 50304


def test_prepare_is_idempotent_and_refuses_silent_overwrite(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DDL_HOME", str(tmp_path))
    assert data_cli(["prepare"]) == 0
    shard = next((tmp_path / "data").glob("*/train_0000.bin"))
    mtime = shard.stat().st_mtime_ns
    assert data_cli(["prepare"]) == 0
    assert "already prepared (use --force to rebuild)" in capsys.readouterr().out
    assert shard.stat().st_mtime_ns == mtime
    assert data_cli(["prepare", "--force"]) == 0 and shard.stat().st_mtime_ns != mtime


def test_interrupted_prepare_resumes(tmp_path, monkeypatch):
    import ddl.data.dataset as dataset
    monkeypatch.setattr(dataset, "SHARD_TOKENS", 50_000)
    real = dataset._unigram_cross_entropy

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset, "_unigram_cross_entropy", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare(DataConfig(), root=tmp_path, progress=False)
    partial = tmp_path / f"{DataConfig().dataset_name()}.partial"
    assert json.loads((partial / "progress.json").read_text())["docs_done"] > 0
    assert not (tmp_path / DataConfig().dataset_name()).exists()        # nothing looks finished
    monkeypatch.setattr(dataset, "_unigram_cross_entropy", real)
    resumed = open_dataset(prepare(DataConfig(), root=tmp_path, progress=False))
    fresh = open_dataset(prepare(DataConfig(), root=tmp_path / "fresh", progress=False))
    assert resumed.manifest["splits"] == fresh.manifest["splits"]


def _prepare_in_child(root):
    prepare(DataConfig(), root=root, progress=False)


def test_two_processes_preparing_at_once_make_one_dataset(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_prepare_in_child, args=(tmp_path,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    [dataset] = [p for p in tmp_path.iterdir() if p.is_dir()]
    open_dataset(dataset).verify()


def test_python_source_is_over_20_mb_here_without_tests_site_packages_or_the_embedded_corpus():
    from ddl.data.sources import python_source_files
    files = python_source_files()
    assert sum(f.stat().st_size for f in files) > 20e6
    assert any(f.parts[-2:] == ("torch", "__init__.py") for f in files) and any(f.name == "argparse.py" for f in files)
    assert not any({"pydoc_data", "test", "tests", "idle_test"}.intersection(f.parts) for f in files)
    params = DataConfig(source="python_source").source_params()
    assert params["python"].count(".") == 2 and params["torch"]         # the versions name the dataset


def test_ddl_data_prepares_python_source(tmp_path, capsys, monkeypatch):
    """The real prepare path over the first 40 of the files (the whole corpus takes ~20 s)."""
    import ddl.data.sources as sources
    from ddl.data.sources import python_source_documents
    files = sources.python_source_files()[:40]
    monkeypatch.setattr(sources, "python_source_files", lambda: files)
    monkeypatch.setenv("DDL_HOME", str(tmp_path))
    assert data_cli(["prepare", "--source", "python_source"]) == 0
    assert "python_source-byte-" in capsys.readouterr().out
    ds = open_dataset(next((tmp_path / "data").glob("python_source-byte-*")))
    docs = list(python_source_documents())
    assert sum(ds.manifest["splits"][s]["docs"] for s in ("train", "val")) == len(docs) == 40
    train = [d for d in docs if not is_val(d, 0.1)]
    tokens = ds.train.concatenated()
    assert ds.tokenizer().decode(tokens[: np.argmax(tokens == 0)].tolist()) == train[0]


@pytest.mark.parametrize("kwargs, key", [
    (dict(source="web"), "data.source"), (dict(tokenizer="words"), "data.tokenizer"),
    (dict(source="files"), "data.files"), (dict(val_fraction=0.0), "data.val_fraction"),
    (dict(encoding="klingon"), "data.encoding"), (dict(encoding="base64"), "data.encoding"),
    (dict(encoding_errors="skip"), "data.encoding_errors")])
def test_invalid_data_configs(kwargs, key):
    with pytest.raises(ValueError, match=rf"^{key}="):
        DataConfig(**kwargs)


def test_a_file_that_is_not_utf8_is_one_line_naming_it_its_byte_and_the_way_out(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DDL_HOME", str(tmp_path / "home"))
    for i in range(40):
        (tmp_path / f"a{i:02d}.txt").write_text(f"English document {i} in plain ASCII. " * 30)
    (tmp_path / "b.txt").write_bytes("Un café au lait, s'il vous plaît. ".encode("latin-1") * 30)
    files = str(tmp_path / "*.txt")
    assert data_cli(["prepare", "--source", "files", "--files", files]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [f"ddl-data: error: data.files='{files}': {tmp_path / 'b.txt'}: not utf-8 at byte 6 (0xe9); set "
                     "data.encoding=<the files' encoding> (latin-1, cp1252, ...) or data.encoding_errors=replace "
                     "(or ignore)"]
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir())   # no lock, no .partial
    assert data_cli(["prepare", "--source", "files", "--files", files, "--encoding", "latin-1"]) == 0
    assert data_cli(["prepare", "--source", "files", "--files", files, "--encoding-errors", "replace"]) == 0
    latin1, replaced = sorted((tmp_path / "home" / "data").glob("files-byte-*/"), key=lambda p: p.stat().st_mtime)
    assert "\ufffd" not in open_dataset(latin1).tokenizer().decode(open_dataset(latin1).train.concatenated().tolist())
    assert latin1.name != replaced.name != DataConfig(source="files", files=files).dataset_name()


def test_the_default_encoding_keeps_the_names_of_earlier_datasets():
    cfg = DataConfig(source="files", files="corpus/*.txt", tokenizer="bpe")
    assert cfg.dataset_name() == "files-bpe-cfd1dd0c"                          # as before the encoding keys
    assert DataConfig(source="files", files="corpus/*.txt", tokenizer="bpe", encoding="UTF8").dataset_name() == \
        cfg.dataset_name()                                                     # one codec, however it is spelt
    assert DataConfig(source="files", files="corpus/*.txt", tokenizer="bpe", encoding="latin-1").source_params()[
        "encoding"] == "iso8859-1"
    assert "encoding" not in DataConfig(encoding="latin-1").source_params()      # the embedded text has none


def _no_text_column(path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"body": ["text under another name " * 20] * 3}), path)


@pytest.mark.parametrize("name, write, message", [
    ("rows.jsonl", lambda p: p.write_text('{"text": "first row"}\n{"body": "no text"}\n'),
     "line 2: must be JSON Lines, one object with a 'text' string per line"),
    ("rows.jsonl", lambda p: p.write_bytes(b'{"text": "first row"}\n{"text": "caf\xe9"}\n'),
     "not utf-8 at byte 35 (0xe9); set data.encoding="),
    ("table.parquet", _no_text_column, "no 'text' column (its columns: body)"),
    ("table.parquet", lambda p: p.write_bytes(b"PAR1 not a parquet file"), "Parquet magic bytes not found"),
    ("notes.csv", lambda p: p.write_text("a,b\n"), "not .txt, .jsonl or .parquet"),
])
def test_each_failure_of_a_file_is_one_line_naming_it_and_leaves_nothing(tmp_path, name, write, message):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("A good document. " * 300)
    write(tmp_path / "in" / name)
    files = str(tmp_path / "in" / "*")
    with pytest.raises(ValueError) as refused:
        prepare(DataConfig(source="files", files=files), root=tmp_path / "d", progress=False)
    assert str(refused.value).startswith(f"data.files='{files}': {tmp_path / 'in' / name}: {message}")
    assert "\n" not in str(refused.value) and not any((tmp_path / "d").iterdir())
