"""`python -m ddl.data.bench` (part of `make bench`): how fast data is prepared, and what the loader costs a step.

Prepare: a corpus in FineWeb-Edu's parquet schema, made from English text this machine has (the Python
manual behind help(), the documentation of the installed Python packages), is prepared with
`source=files` for each tokenizer on one worker and on `--workers`: tokens/s of wall time, CPU seconds
of the parent and of its workers (the machine may be shared: CPU time is what a quiet core would take),
and what 50B tokens take on 1, 32 and 64 cores. GPT-2 where tiktoken's file is cached; where it is not
(no network), a stand-in says what tiktoken itself does: GPT-2's pattern with a 50,257-token table
trained here.

Loader: milliseconds per batch of `BatchLoader` at the paper's shape (1024 tokens a row, 16 and 24 rows)
over 32 MiB shards, beside a paper-small step.

    python -m ddl.data.bench [--mb 40] [--workers 2] [--tokenizers byte,bpe,gpt2] [--out reports/bench]

Writes prepare.{json,md} in --out.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import resource
import shutil
import statistics
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .. import paths
from ..validation import OneLineParser, at_least_one, positive_number, printable_path, unknown_names
from .config import TOKENIZERS, DataConfig
from .sources import embedded_documents

PAPER_TOKENS = 50e9
PROJECTED_CORES = (1, 32, 64)
# A paper-small training step (bf16, compiled per block, 16 x 1024 tokens) on an H100: `make gpu-check`,
# 2026-11-26 (docs/performance.md).
PAPER_SMALL_STEP_MS_H100 = 41.2
FINEWEB_DOC_CHARS = 4000   # about a FineWeb-Edu document's length


# -- the corpus ---------------------------------------------------------------------------------
def machine_text() -> Iterator[str]:
    """English prose this machine has: the manual's topics, then each installed package's README, license,
    documentation and METADATA text, cut at blank lines into documents of about FINEWEB_DOC_CHARS."""
    yield from embedded_documents()
    site = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in site.rglob("*") if (p.suffix in (".md", ".rst", ".txt") or p.name == "METADATA")
                   and p.is_file())
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        chunk: list[str] = []
        for paragraph in text.split("\n\n"):
            chunk.append(paragraph)
            if sum(map(len, chunk)) >= FINEWEB_DOC_CHARS:
                yield "\n\n".join(chunk)
                chunk = []
        if sum(map(len, chunk)) >= 200:
            yield "\n\n".join(chunk)


def write_fineweb_parquet(directory: Path, docs: Iterable[str], rows_per_file: int = 5000,
                          row_group_size: int = 1000) -> list[Path]:
    """The documents as parquet files in FineWeb-Edu's schema (text, id, dump, url, file_path, language,
    language_score, token_count, score, int_score), `row_group_size` rows a row group as datatrove writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    directory.mkdir(parents=True, exist_ok=True)
    written, rows = [], []

    def flush() -> None:
        path = directory / f"{len(written):03d}_00000.parquet"
        n = len(rows)
        table = pa.table({
            "text": rows, "id": [f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'{path.name}/{i}')}>" for i in range(n)],
            "dump": ["CC-MAIN-2024-10"] * n, "url": [f"https://example.org/{path.stem}/{i}" for i in range(n)],
            "file_path": [f"s3://commoncrawl/crawl-data/CC-MAIN-2024-10/{path.stem}.warc.gz"] * n,
            "language": ["en"] * n, "language_score": pa.array([0.95] * n, pa.float64()),
            "token_count": pa.array([len(t) // 4 for t in rows], pa.int64()),
            "score": pa.array([3.2] * n, pa.float64()), "int_score": pa.array([3] * n, pa.int64())})
        pq.write_table(table, path, row_group_size=row_group_size)
        written.append(path)
        rows.clear()
    for doc in docs:
        rows.append(doc)
        if len(rows) == rows_per_file:
            flush()
    if rows:
        flush()
    return written


def corpus_docs(megabytes: float) -> Iterator[str]:
    """machine_text(), over again until `megabytes` of UTF-8 (each pass a copy of the same documents)."""
    from .dataset import within_bytes
    return within_bytes(itertools.cycle(list(machine_text())), int(megabytes * 1e6))


# -- prepare ------------------------------------------------------------------------------------
def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def measure_prepare(cfg: DataConfig, workers: int, root: Path, tokenizer_file: Path | None) -> dict:
    """One `prepare` on `workers` into a fresh `root` (a trained BPE's file placed where the build looks for
    it, so only tokenizing is timed): wall, CPU of this process and of its workers, and the load."""
    from .dataset import prepare
    shutil.rmtree(root, ignore_errors=True)
    if tokenizer_file is not None:
        work = root / f"{cfg.dataset_name()}.partial"
        work.mkdir(parents=True)
        shutil.copy(tokenizer_file, work / tokenizer_file.name)
    load, cpu, children = os.getloadavg()[0], _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    path = prepare(cfg, root=root, progress=False, workers=workers)
    wall = time.perf_counter() - start
    parent, worker = _cpu(resource.RUSAGE_SELF) - cpu, _cpu(resource.RUSAGE_CHILDREN) - children
    manifest = json.loads((path / "manifest.json").read_text())
    tokens = sum(manifest["splits"][s]["tokens"] for s in ("train", "val"))
    text = sum(manifest["splits"][s]["bytes"] for s in ("train", "val"))
    return {"workers": workers, "tokens": tokens, "bytes_per_token": text / tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "cpu_parent_s": parent, "cpu_workers_s": worker,
            "tokens_per_cpu_s": tokens / (parent + worker), "load_before": load, "load_after": os.getloadavg()[0],
            "manifest_sha256": _digest(path / "manifest.json")}


def _digest(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def trained_bpe(cfg: DataConfig, scratch: Path) -> tuple[Path, float]:
    """The BPE `prepare` would train for `cfg` (on its train split), and the seconds it took."""
    from .dataset import _tokenizer_for
    work = scratch / "bpe-train"
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    _tokenizer_for(cfg, work)
    return work / "tokenizer.json", time.perf_counter() - start


def gpt2_standin(cfg: DataConfig, scratch: Path):
    """tiktoken with GPT-2's pattern and a 50,257-token table trained here (the same engine, regex and table
    size as GPT-2's; its merges are this corpus's)."""
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    from .sources import documents
    from .tokenizers import BPETokenizer, GPT2Tokenizer
    bpe = BPETokenizer.train(documents(cfg), 50257, scratch / "gpt2-standin.json")._tok
    to_byte = _byte_decoder()
    ids = {bytes(to_byte[c] for c in token): i for token, i in bpe.get_vocab().items() if token != "<|endoftext|>"}
    ranks = {token: rank for rank, token in enumerate(sorted(ids, key=ids.get))}    # merge order, from 0
    standin = GPT2Tokenizer(tiktoken.Encoding("gpt2-standin", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                              special_tokens={"<|endoftext|>": len(ranks)}))
    standin.vocab_size = len(ranks) + 1          # what this corpus allowed (50,257 at most)
    return standin


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, reversed: the character a byte-level BPE writes for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


def measure_in_process(cfg: DataConfig, tokenizer) -> dict:
    """What one worker does (read, split, tokenize each unit), in this process, with `tokenizer`."""
    from .parallel import _library_threads_off, tokenize_unit
    from .sources import units
    load, cpu, start = os.getloadavg()[0], _cpu(resource.RUSAGE_SELF), time.perf_counter()
    tokens = text = 0
    with _library_threads_off():
        for unit in units(cfg):
            done = tokenize_unit(unit, cfg, tokenizer)
            tokens, text = tokens + int(done.lengths.sum()), text + int(done.n_bytes.sum())
    wall, spent = time.perf_counter() - start, _cpu(resource.RUSAGE_SELF) - cpu
    return {"workers": 1, "tokens": tokens, "bytes_per_token": text / tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "cpu_parent_s": spent,
            "cpu_workers_s": 0.0, "tokens_per_cpu_s": tokens / spent, "load_before": load,
            "load_after": os.getloadavg()[0]}


def projection(one: dict, many: dict | None, ceiling: float = float("inf")) -> dict:
    """Hours for PAPER_TOKENS on each of PROJECTED_CORES: a worker per core at the measured tokens per CPU-second
    of a worker (of the parallel run `many`, else of `one`), capped by the parent's own pace (tokens per
    CPU-second of the parent, which writes: `many`'s, else `ceiling`, another tokenizer's)."""
    if many is None or not many["cpu_workers_s"]:
        per_worker = one["tokens_per_cpu_s"]
    else:
        per_worker = many["tokens"] / many["cpu_workers_s"]
        ceiling = many["tokens"] / max(many["cpu_parent_s"], 1e-9)
    return {"per_worker_tokens_per_cpu_s": per_worker, "parent_ceiling_tokens_per_s": ceiling,
            "hours": {cores: PAPER_TOKENS / min(per_worker * cores, ceiling) / 3600 for cores in PROJECTED_CORES}}


def bench_prepare(megabytes: float, workers: int, tokenizers: list[str], scratch: Path) -> dict:
    from .tokenizers import load_tokenizer
    files = write_fineweb_parquet(scratch / "corpus", corpus_docs(megabytes))
    glob = str(scratch / "corpus" / "*.parquet")
    result = {"corpus": {"files": len(files), "megabytes": sum(f.stat().st_size for f in files) / 1e6,
                         "glob": glob}, "tokenizers": {}}
    for name in tokenizers:
        cfg = DataConfig(source="files", files=glob, tokenizer=name)
        entry: dict = {}
        tokenizer_file = None
        if name == "bpe":
            tokenizer_file, entry["train_s"] = trained_bpe(cfg, scratch)
        if name == "gpt2":
            try:
                load_tokenizer("gpt2")
            except ValueError as err:
                entry["absent"] = str(err)
                standin = gpt2_standin(cfg, scratch)
                entry["standin"] = {**measure_in_process(cfg, standin), "table": standin.vocab_size}
                ceilings = [e["projection"]["parent_ceiling_tokens_per_s"] for e in result["tokenizers"].values()
                            if e.get("runs") and e["runs"][0]["bytes_per_token"] > 1]   # the parent's work per
                entry["projection"] = projection(entry["standin"], None, min(ceilings, default=float("inf")))  # token
                result["tokenizers"][name] = entry
                continue
        runs = [measure_prepare(cfg, n, scratch / f"{name}-{n}", tokenizer_file) for n in sorted({1, workers})]
        entry["runs"] = runs
        entry["speedup"] = runs[-1]["tokens_per_s"] / runs[0]["tokens_per_s"]
        entry["same_manifest"] = len({r["manifest_sha256"] for r in runs}) == 1
        entry["projection"] = projection(runs[0], runs[-1] if len(runs) > 1 else None)
        result["tokenizers"][name] = entry
    return result


# -- the loader ---------------------------------------------------------------------------------
def bench_loader(scratch: Path, rounds: int = 5, batches: int = 200) -> dict:
    """ms per BatchLoader batch (1024 tokens a row) over two 32 MiB shards of random tokens, on CPU, and on
    CUDA (pinned, non-blocking) where there is one; beside a paper-small step on an H100."""
    import torch

    from .dataset import Split
    from .loader import BatchLoader
    shards = []
    for i in range(2):
        tokens = np.random.default_rng(i).integers(0, 50257, size=1 << 24, dtype=np.uint16)
        tokens.tofile(scratch / f"train_{i}.bin")
        shards.append({"file": f"train_{i}.bin", "tokens": int(tokens.size)})
    split = Split(scratch, {"shards": shards, "tokens": sum(s["tokens"] for s in shards)})
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    found = {}
    for device in devices:
        for batch in (16, 24):
            loader = BatchLoader(split, batch, 1024, seed=0, device=torch.device(device))
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                for _ in range(batches):
                    x, _y = loader.next_batch()
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - start) / batches * 1e3)
            ms = statistics.median(times)
            found[f"{device} B={batch}"] = {"ms_per_batch": ms, "share_of_h100_step": ms / PAPER_SMALL_STEP_MS_H100}
    return found


# -- the report ---------------------------------------------------------------------------------
def _rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def markdown(result: dict) -> str:
    corpus = result["prepare"]["corpus"]
    lines = [f"# ddl-data prepare and the loader, {result['date']}", "",
             f"{result['machine']}; {result['cpus']} CPUs; load average {result['load'][0]:.2f} at the start.", "",
             f"Corpus: {corpus['files']} parquet files in FineWeb-Edu's schema, {corpus['megabytes']:.1f} MB.", "",
             "| tokenizer | workers | tokens | wall (s) | tokens/s | CPU parent + workers (s) | tokens per CPU-s "
             "| load before-after |", "|---|---|---|---|---|---|---|---|"]
    for name, entry in result["prepare"]["tokenizers"].items():
        for run in entry.get("runs", []) + ([entry["standin"]] if "standin" in entry else []):
            label = name if "standin" not in entry else \
                f"{name} stand-in (tiktoken, GPT-2's pattern, a {entry['standin']['table']:,}-token table)"
            lines.append(f"| {label} | {run['workers']} | {run['tokens']:,} | {run['wall_s']:.1f} | "
                         f"{_rate(run['tokens_per_s'])} | {run['cpu_parent_s']:.1f} + {run['cpu_workers_s']:.1f} | "
                         f"{_rate(run['tokens_per_cpu_s'])} | {run['load_before']:.1f}-{run['load_after']:.1f} |")
    lines += ["", "| tokenizer | speed-up | same manifest | per worker (tokens/CPU-s) | parent's ceiling (tokens/s) | "
              + " | ".join(f"50B on {c} cores (h)" for c in PROJECTED_CORES) + " |",
              "|---|---|---|---|---|" + "---|" * len(PROJECTED_CORES)]
    for name, entry in result["prepare"]["tokenizers"].items():
        p = entry["projection"]
        ceiling = p["parent_ceiling_tokens_per_s"]
        shown = "" if ceiling == float("inf") else _rate(ceiling)
        lines.append(f"| {name} | {entry.get('speedup', float('nan')):.2f} | {entry.get('same_manifest', '')} | "
                     f"{_rate(p['per_worker_tokens_per_cpu_s'])} | {shown} | "
                     + " | ".join(f"{p['hours'][c]:.2f}" for c in PROJECTED_CORES) + " |")
        if "absent" in entry:
            lines.append(f"\n{name}: {entry['absent']}")
    lines += ["", "| loader | ms per batch | share of a paper-small H100 step "
              f"({PAPER_SMALL_STEP_MS_H100} ms) |", "|---|---|---|"]
    lines += [f"| {key} x 1024 | {v['ms_per_batch']:.3f} | {v['share_of_h100_step']:.2%} |"
              for key, v in result["loader"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m ddl.data.bench", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=positive_number, default=40.0, help="megabytes of text in the corpus")
    parser.add_argument("--workers", type=at_least_one, default=2, help="the parallel run's workers (beside one)")
    parser.add_argument("--tokenizers", default=",".join(TOKENIZERS), help="comma-separated, of the default's")
    parser.add_argument("--out", type=printable_path, default=None,
                        help="where prepare.{json,md} go (default reports/bench)")
    args = parser.parse_args(argv)
    if error := unknown_names("--tokenizers", args.tokenizers.split(","), TOKENIZERS):
        parser.error(error)
    out = args.out or (paths.project_root() or Path.cwd()) / "reports" / "bench"
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()} {_cpu_model()}",
              "cpus": os.cpu_count(), "load": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="ddl-data-bench-") as scratch:
        result["prepare"] = bench_prepare(args.mb, args.workers, args.tokenizers.split(","), Path(scratch))
        result["loader"] = bench_loader(Path(scratch))
    out.mkdir(parents=True, exist_ok=True)
    (out / "prepare.json").write_text(json.dumps(result, indent=1, default=str))
    text = markdown(result)
    (out / "prepare.md").write_text(text)
    print(text, end="")
    print(f"written: {out / 'prepare.md'}")
    return 0


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
