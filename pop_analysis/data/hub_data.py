"""Hugging Face hub data sets, read as bounded as local files: through the hub's Parquet export.

The hub converts every public data set to Parquet (the revision refs/convert/parquet, laid out
CONFIG/SPLIT/NNNN.parquet). Reading those files over HTTP range requests with the local Parquet
reader (readers.parquet_records) gets the same bounds: the footer first, only the prompt's
columns, each row group's uncompressed size checked from its metadata before it is fetched and
decompressed, rows read only up to the sample count. `datasets` streaming would decode whole row
groups (or compressed JSON) of any size first. Needs a network; tests pass a local filesystem.
"""
from __future__ import annotations

from pop_analysis.data.readers import DatasetError, parquet_records
from pop_analysis.errors import listed

EXPORT = "refs%2Fconvert%2Fparquet"  # the revision of the hub's Parquet export, quoted


def hub_filesystem():
    """The hub as an fsspec filesystem (HTTP range reads; the token of `hf auth login`, if any)."""
    from huggingface_hub import HfFileSystem

    return HfFileSystem()


def parse_source(source: str, default_split: str = "train",
                 default_config: str | None = None) -> tuple[str, str | None, str]:
    """'hf:NAME[:split]' or 'hf:NAME:config:split' -> (name, config or None, split)."""
    parts = [p.strip() for p in source[3:].split(":")]
    if not parts[0] or len(parts) > 3:
        raise DatasetError(f"{source}: expected hf:NAME, hf:NAME:split or hf:NAME:config:split")
    config = parts[1] or None if len(parts) == 3 else default_config
    split = parts[-1] if len(parts) > 1 and parts[-1] else default_split
    return parts[0], config, split


def export_files(fs, name: str, config: str | None, split: str, label: str) -> list[str]:
    """The Parquet files of one split of the export, in order."""
    root = f"datasets/{name}@{EXPORT}"
    if config is None:
        configs = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
        if "default" not in configs and len(configs) != 1:
            raise DatasetError(f"{label}: name a config, hf:{name}:CONFIG:{split} "
                               f"(configs: {listed(configs)})")
        config = "default" if "default" in configs else configs[0]
    for folder in (split, f"partial-{split}"):  # a large set's export may be partial
        files = sorted(fs.glob(f"{root}/{config}/{folder}/*.parquet"))
        if files:
            return files
    splits = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/{config}", detail=False))
    raise DatasetError(f"{label}: no split {split!r} in config {config!r} (splits: "
                       f"{listed(splits)})")


def hub_records(source: str, columns, default_split: str = "train",
                default_config: str | None = None, fs=None):
    """(where, record) per row of a hub data set's split, reading only `columns(names)`."""
    name, config, split = parse_source(source, default_split, default_config)
    fs = fs or hub_filesystem()
    for path in export_files(fs, name, config, split, source):
        with fs.open(path, "rb") as f:
            yield from parquet_records(f, f"{source} {path.rsplit('/', 1)[-1]}", columns)
