"""The per-model table of `status` and the end-of-run summary (several models, or adapters)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_models(console: Console, models: dict[str, dict[str, Any]]) -> None:
    """One row per base model and adapter: requests, completed, failed, pending, tokens, and
    generated tokens a second."""
    table = Table(title="models", title_justify="left")
    table.add_column("model")
    for col in ("requests", "completed", "failed", "pending", "tokens in/out", "tok/s"):
        table.add_column(col, justify="right")
    for name, row in models.items():
        base = row["adapter_of"]
        tokens = row["tokens"]
        rate = row.get("completion_tokens_per_s")
        table.add_row(
            f"{name} (adapter on {base})" if base else name,
            f"{row['requests']:,}",
            f"{row['completed']:,}",
            f"{row['failed']:,}",
            f"{row['pending']:,}",
            f"{tokens['prompt']:,}/{tokens['completion']:,}",
            "-" if rate is None else f"{rate:,.1f}",
        )
    console.print(table)
