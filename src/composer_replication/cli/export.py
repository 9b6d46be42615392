"""Write an ingest folder as a dataset other tools read.

``--format openai`` writes OUT/train.jsonl: one conversation per line as OpenAI chat messages (assistant
``tool_calls``, ``tool`` results) with the session's ``tools`` (function schemas), what TRL's SFTTrainer,
axolotl and OpenAI fine-tuning take. ``--format hf-agent-traces`` writes OUT/sessions/<source>/*.jsonl in
the Hugging Face Hub's Session Trace format (its agent-trace viewer). Secrets were redacted at ingest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from composer_replication.ingestion.export import FORMATS

    p.add_argument("ingest_dir", type=Path, metavar="INGEST_DIR", help="the folder `ingest` wrote")
    p.add_argument("--format", choices=FORMATS, default="openai", help="dataset layout (default openai)")
    p.add_argument("--out", type=Path, required=True, help="folder to write (replaced as a whole)")
    p.add_argument(
        "--arguments",
        choices=("object", "string"),
        default="object",
        help="openai: tool-call arguments as JSON objects (Hugging Face chat templates, default) or as "
        "JSON text (OpenAI's fine-tuning format)",
    )
    p.add_argument("--allow-unredacted", action="store_true", help="export an ingest made with redaction off")


def run(args: argparse.Namespace) -> int:
    from composer_replication.ingestion.export import export_dataset

    got = export_dataset(
        args.ingest_dir, args.out, fmt=args.format, arguments=args.arguments,
        allow_unredacted=args.allow_unredacted,
    )  # fmt: skip
    unit = "conversations" if got["format"] == "openai" else "sessions"
    print(f"{got['rows']} {unit} ({got['format']}) -> {got['out']}", file=sys.stderr)
    return 0
