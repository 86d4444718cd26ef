"""The documents of one input file: plain text (the file is one document), JSONL (one document per line, from
a text field) or Parquet (one document per row of a text column). A file that is not text is refused."""
from __future__ import annotations

import json

from autohet_ray import ConfigError

TEXT, JSONL, PARQUET = "text", "jsonl", "parquet"
_KIND_OF_SUFFIX = {".jsonl": JSONL, ".ndjson": JSONL, ".parquet": PARQUET}


def input_kind(name: str) -> str:
    """The format of an input file, from its name: .jsonl/.ndjson, .parquet, anything else plain text."""
    dot = name.rfind(".")
    return _KIND_OF_SUFFIX.get(name[dot:].lower(), TEXT) if dot >= 0 else TEXT


def documents_of(name: str, data: bytes, *, text_field: str = "text") -> list[str]:
    """The non-empty documents of input file `name` whose bytes are `data`."""
    kind = input_kind(name)
    if kind == PARQUET:
        return _parquet_documents(name, data, text_field)
    text = _decode_text(name, data)
    if kind == JSONL:
        return _jsonl_documents(name, text, text_field)
    return [text] if text.strip() else []


def _decode_text(name: str, data: bytes) -> str:
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"input {name!r} is not text: it holds a NUL byte at offset {nul} (binary file?); "
                          "give plain text, JSONL or Parquet")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"input {name!r} is not UTF-8 text: invalid byte at offset {err.start}") from None


def _jsonl_documents(name: str, text: str, text_field: str) -> list[str]:
    documents = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"input {name!r} line {number} is not JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            raise ConfigError(f"input {name!r} line {number} has no string field {text_field!r} "
                              "(set the field with --text-field)")
        if record[text_field].strip():
            documents.append(record[text_field])
    return documents


def _parquet_documents(name: str, data: bytes, text_field: str) -> list[str]:
    import pyarrow as pa  # lazy: pyarrow, for Parquet inputs only
    import pyarrow.parquet as pq  # lazy: pyarrow, for Parquet inputs only
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as err:
        raise ConfigError(f"input {name!r} is not a Parquet file ({err})") from None
    columns = parquet.schema_arrow.names
    if text_field not in columns:
        raise ConfigError(f"input {name!r} has no column {text_field!r}; its columns: {', '.join(columns)} "
                          "(set the column with --text-field)")
    column = parquet.read(columns=[text_field]).column(text_field)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise ConfigError(f"input {name!r}: column {text_field!r} is {column.type}, not a string column")
    return [value for value in column.to_pylist() if value is not None and value.strip()]
