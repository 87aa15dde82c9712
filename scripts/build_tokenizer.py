"""Build the default tokenizer offline (BPE over every env's text) into a transformers-format directory.

    python scripts/build_tokenizer.py [--out DIR] [--vocab-size 512] [--seed 0]

Without ``--out`` it builds the cached default that ``ensure_default_tokenizer`` (and ``make demo``) use.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipelines_lib.model.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    build_tokenizer,
    default_tokenizer_dir,
    load_tokenizer,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the cache location)")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = build_tokenizer(args.out or default_tokenizer_dir(), vocab_size=args.vocab_size, seed=args.seed)
    tok = load_tokenizer(out)
    print(json.dumps({"path": str(out), "vocab_size": tok.vocab_size, "tokenizer_hash": tok.tokenizer_hash}))


if __name__ == "__main__":
    main()
