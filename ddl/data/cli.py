"""`ddl-data prepare|info`: build token shards from a text source, or show a dataset's manifest."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import paths
from ..text import plural
from ..validation import OneLineParser, at_least_one
from .config import ENCODING_ERRORS, SOURCES, TOKENIZERS, DataConfig


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ddl-data", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="tokenize a source into train/val shards under DDL_HOME/data")
    prep.add_argument("--source", choices=SOURCES, default="embedded")
    prep.add_argument("--tokenizer", choices=TOKENIZERS, default="byte")
    prep.add_argument("--files", help="glob of .txt/.jsonl/.parquet files (source=files)")
    prep.add_argument("--encoding", default=DataConfig.encoding, help="of the .txt/.jsonl files (source=files)")
    prep.add_argument("--encoding-errors", choices=ENCODING_ERRORS, default=DataConfig.encoding_errors,
                      help="a byte the encoding cannot decode: refuse the file, replace it with U+FFFD, or drop it")
    prep.add_argument("--fineweb-name", default=DataConfig.fineweb_name, help="Hub id or local parquet glob")
    prep.add_argument("--fineweb-config", default=DataConfig.fineweb_config, help="the Hub dataset's config")
    prep.add_argument("--fineweb-revision", default=DataConfig.fineweb_revision, help="the Hub commit to stream")
    prep.add_argument("--tokens", type=int, default=DataConfig.fineweb_tokens, help="fineweb_edu token budget")
    prep.add_argument("--bpe-vocab", type=int, default=DataConfig.bpe_vocab)
    prep.add_argument("--val-fraction", type=float, default=DataConfig.val_fraction, help="the held-out share")
    prep.add_argument("--workers", type=at_least_one, default=None,
                      help="processes that tokenize (default: the CPUs of the machine, or of the SLURM job)")
    prep.add_argument("--force", action="store_true", help="rebuild a finished dataset")
    info = sub.add_parser("info", help="print a dataset's manifest")
    info.add_argument("dataset", help="dataset directory, or its name under DDL_HOME/data")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "info":
            from .dataset import open_dataset
            path = Path(args.dataset)
            print(json.dumps(open_dataset(path if path.is_dir() else paths.data_dir() / args.dataset).manifest,
                             indent=1))
            return 0
        from .dataset import MANIFEST, open_dataset, prepare
        cfg = DataConfig(source=args.source, tokenizer=args.tokenizer, files=args.files, encoding=args.encoding,
                         encoding_errors=args.encoding_errors, fineweb_name=args.fineweb_name,
                         fineweb_config=args.fineweb_config, fineweb_revision=args.fineweb_revision,
                         fineweb_tokens=args.tokens, bpe_vocab=args.bpe_vocab, val_fraction=args.val_fraction)
        existed = (paths.data_dir() / cfg.dataset_name() / MANIFEST).is_file()
        path = prepare(cfg, force=args.force, workers=args.workers)
    except ValueError as err:
        print(f"ddl-data: error: {err}")
        return 2
    except OSError as err:   # a read-only or full DDL_HOME (an unreadable input file is a ValueError naming it)
        print(f"ddl-data: error: {err.filename or paths.data_dir()}: {err.strerror or err}")
        return 1
    if existed and not args.force:
        print(f"already prepared (use --force to rebuild): {path}")
    m = open_dataset(path).manifest
    splits = ", ".join(f"{s} {m['splits'][s]['tokens']:,} tokens in {plural(len(m['splits'][s]['shards']), 'shard')}"
                       for s in m["splits"])
    print(f"{path}\n  tokenizer {m['tokenizer']['name']} (vocab {m['tokenizer']['vocab_size']}); {splits}; "
          f"unigram cross-entropy {m['unigram_xent_val']:.3f} nats/token")
    return 0
