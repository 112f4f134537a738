"""Streaming readers of local data files: each yields (where, record), `where` like "line 7".

Records are read as they are asked for, so taking the first 2 prompts of a 200 MB file reads a
few kilobytes of it. Every failure is a DatasetError naming the file (as the caller labels it)
and the line: bytes that are not UTF-8, invalid JSON, a CSV quote that is never closed.
"""
from __future__ import annotations

import codecs
import csv
import json
from contextlib import contextmanager
from pathlib import Path

from pop_analysis.errors import InputError, first_line

CHUNK = 1 << 16  # bytes per read of a JSON document (doubled while one value is longer)
# The longest line (or JSON value) read: far beyond any prompt a context holds (a 1M-token context
# at 16 characters a token), short of what would take seconds and gigabytes to tokenise.
MAX_LINE_BYTES = 16 << 20
MAX_TEXT_CHARS = 16 << 20  # characters of a whole text source read at most (drift by length)


class DatasetError(InputError):
    """A prompt source that cannot be read; the message names the file and line."""


@contextmanager
def _opened(path: Path, name: str):
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DatasetError(f"{name}: cannot read ({e.strerror or first_line(e)})") from None
    with f:
        yield f


def text_lines(path: Path, name: str | None = None, max_line_bytes: int = MAX_LINE_BYTES):
    """(line number, text with its newline) per line, decoded as UTF-8 one line at a time; a line
    longer than max_line_bytes (its newline included) is refused before more of it is read."""
    name = name or str(path)
    with _opened(path, name) as f:
        for n, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""), start=1):
            if len(raw) > max_line_bytes:
                raise DatasetError(f"{name} line {n}: longer than {_size(max_line_bytes)}; no "
                                   "prompt is that long (is it one record per line?)")
            if b"\0" in raw:
                raise DatasetError(f"{name} line {n}: NUL bytes (binary data, not text)")
            try:
                yield n, raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{name} line {n}: not UTF-8 text (byte {e.start + 1} of the "
                                   "line)") from None


def _short(e: ValueError) -> str:
    """Python's own message, to its first clause ('Exceeds the limit (4300 digits) for integer
    string conversion: value has 5000 digits; use sys.set_int_max_str_digits() ...')."""
    return first_line(e).split(";")[0]


def _size(n: int) -> str:
    return f"{n / (1 << 20):.4g} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_text(path: Path, name: str | None = None, max_chars: int = MAX_TEXT_CHARS) -> str:
    """The file as text, its first max_chars characters at most (a UTF-8 error names the file
    and line)."""
    parts, size = [], 0
    for _, text in text_lines(path, name):
        parts.append(text[:max_chars - size])
        size += len(parts[-1])
        if size >= max_chars:
            break
    return "".join(parts)


def jsonl_records(path: Path, name: str | None = None):
    """(where, record) per non-empty line of a JSONL file; bad JSON names the file and line."""
    name = name or str(path)
    for n, line in text_lines(path, name):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{name} line {n}: invalid JSON ({e.msg})") from None
        except ValueError as e:  # an integer of more digits than Python converts
            raise DatasetError(f"{name} line {n}: invalid JSON ({_short(e)})") from None
        except RecursionError:
            raise DatasetError(f"{name} line {n}: JSON nested too deeply") from None
        yield f"line {n}", record


def txt_records(path: Path, name: str | None = None):
    """One record (a string) per non-empty line."""
    for n, line in text_lines(path, name):
        if line.strip():
            yield f"line {n}", line.strip()


def csv_records(path: Path, name: str | None = None):
    """(where, {column: value}) per row under the header row; quoting is strict."""
    name = name or str(path)
    lines = (text for _, text in text_lines(path, name))
    reader = csv.reader(lines, strict=True)
    header = _csv_row(reader, name)
    if not header:
        raise DatasetError(f"{name} line 1: no header row")
    while True:
        start = reader.line_num + 1
        row = _csv_row(reader, name, start)
        if row is None:
            return
        if not row:
            continue  # a blank line
        if len(row) > len(header):
            raise DatasetError(f"{name} line {start}: more values than header columns")
        yield f"line {start}", dict(zip(header, row + [None] * (len(header) - len(row))))


def _csv_row(reader, name: str, start: int = 1) -> list[str] | None:
    try:
        return next(reader)
    except StopIteration:
        return None
    except csv.Error as e:
        if "unexpected end of data" in str(e):
            raise DatasetError(f"{name} line {start}: a quoted field opened here is never "
                               "closed") from None
        raise DatasetError(f"{name} line {reader.line_num}: {first_line(e)}") from None


# --- Parquet: bounded from the file's metadata before anything is decompressed ---------------

# The uncompressed bytes of the columns read, per row group, from the file's own metadata: a
# compressed bomb (4 GiB of text in 2.5 KB) is refused before it is decompressed. Rewrite a file
# beyond it with smaller row groups (pyarrow: write_table(..., row_group_size=N)).
MAX_ROW_GROUP_BYTES = 256 << 20
MAX_PARQUET_TEXT = 256 << 20  # bytes of rows decoded in all (dictionary pages repeat values)
BATCH_BYTES = 32 << 20  # decoded bytes aimed at per batch of rows
MAX_BATCH_ROWS = 256


def parquet_records(path, name: str | None = None, columns=None):
    """(where, record) per row, reading only `columns(names) -> list` of the schema's columns
    (default: all), one row group at a time, in batches sized from the row group's metadata;
    each row's decoded size is checked before it becomes Python objects. `path` may be an open
    binary file (a hub file)."""
    name = name or str(path)
    pf = _parquet_file(path, name)
    names = pf.schema_arrow.names
    cols = list(columns(names)) if columns else names
    leaves = [j for j in range(pf.metadata.num_columns)
              if pf.metadata.schema.column(j).path.split(".")[0] in cols]
    row, text = 0, 0
    for i in range(pf.metadata.num_row_groups):
        group = pf.metadata.row_group(i)
        size = sum(group.column(j).total_uncompressed_size for j in leaves)
        if size > MAX_ROW_GROUP_BYTES:
            raise DatasetError(f"{name} row group {i + 1}: {_size(size)} uncompressed in column"
                               f"(s) {', '.join(cols)}, more than the {_size(MAX_ROW_GROUP_BYTES)}"
                               " read at once; rewrite it with smaller row groups")
        for batch in _batches(pf, i, cols, _batch_rows(group, leaves, size), name):
            for j in range(batch.num_rows):
                row += 1
                one = _decoded(batch.slice(j, 1))  # (1 row)
                text += one.nbytes
                if one.nbytes > MAX_LINE_BYTES:
                    raise DatasetError(f"{name} row {row}: longer than {_size(MAX_LINE_BYTES)}; "
                                       "no prompt is that long")
                if text > MAX_PARQUET_TEXT:
                    raise DatasetError(f"{name} row {row}: the rows read hold more than "
                                       f"{_size(MAX_PARQUET_TEXT)}; ask for fewer rows")
                yield f"row {row}", one.to_pylist()[0]


def _parquet_file(path, name: str):
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path)  # the footer only
    except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds for a damaged file
        raise DatasetError(f"{name}: not a readable Parquet file ({first_line(e)})") from None


def _batch_rows(group, leaves, size: int) -> int:
    """Rows per batch: about BATCH_BYTES decoded. A dictionary page can be referenced by every
    row, so a row may decode to the whole chunk: then size, not size / rows, is a row's bound."""
    dictionary = any(group.column(j).has_dictionary_page for j in leaves)
    per_row = size if dictionary else size / max(group.num_rows, 1)
    return int(min(MAX_BATCH_ROWS, max(1, BATCH_BYTES // max(per_row, 1))))


def _batches(pf, group: int, cols, rows: int, name: str):
    try:
        yield from pf.iter_batches(batch_size=rows, row_groups=[group], columns=cols)
    except Exception as e:  # noqa: BLE001
        raise DatasetError(f"{name} row group {group + 1}: not readable "
                           f"({first_line(e)})") from None


def _decoded(batch):
    """A one-row batch with dictionary columns decoded (their slice would count the whole
    dictionary, and to_pylist would copy the value anyway)."""
    import pyarrow as pa

    cols = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(cols, names=batch.schema.names)


# --- JSON documents: a list of records, or an object whose first list member holds them -------

def json_records(path: Path, name: str | None = None):
    """(where, record) per item of the document's list (or of the one list member of an object
    wrapper), parsed item by item."""
    name = name or str(path)
    with _opened(path, name) as f:
        doc = _JsonStream(f, name)
        first = doc.peek()
        if first == "{":
            doc.enter_first_list()
        elif first != "[":
            raise DatasetError(f"{name} line {doc.line()}: expected a list of records, or an "
                               "object holding exactly one list")
        for i, rec in enumerate(doc.items(), start=1):
            yield f"item {i}", rec


class _JsonStream:
    """A JSON text read in growing chunks; values are decoded one at a time with raw_decode."""

    def __init__(self, f, name: str):
        self.f, self.name = f, name
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.buf, self.pos = "", 0
        self.lines_before = 0  # newlines in text already dropped from buf
        self.eof = False
        self.want = CHUNK
        self.nested = False  # the records sit in a wrapper object

    def _more(self) -> bool:
        """Append the next chunk (as long as the buffer, so long values cost linear time)."""
        if self.eof:
            return False
        if self.pos > len(self.buf) // 2:  # drop consumed text, keeping line numbers
            self.lines_before += self.buf.count("\n", 0, self.pos)
            self.buf, self.pos = self.buf[self.pos:], 0
        raw = self.f.read(max(self.want, len(self.buf)))
        self.eof = not raw
        try:
            self.buf += self.decoder.decode(raw, final=self.eof)
        except UnicodeDecodeError:
            raise DatasetError(f"{self.name} line {self.line(len(self.buf))}: not UTF-8 "
                               "text") from None
        return True

    def line(self, at: int | None = None) -> int:
        return self.lines_before + self.buf.count("\n", 0, self.pos if at is None else at) + 1

    def peek(self) -> str:
        """The next non-blank character ('' at the end), without consuming it."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def expect(self, chars: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            found = repr(c) if c else "the end of the file"
            raise DatasetError(f"{self.name} line {self.line()}: invalid JSON (expected "
                               f"{' or '.join(map(repr, chars))}, found {found})")
        self.pos += 1
        return c

    def value(self):
        """The next JSON value; reads on while the buffer may cut it short."""
        self.peek()
        while True:
            try:
                value, end = json.JSONDecoder().raw_decode(self.buf, self.pos)
                # A number near the end may be cut short ('12' of '12.5', '1' of '1e-3').
                if self.eof or len(self.buf) - end > 2:
                    self.pos = end
                    return value
            except json.JSONDecodeError as e:
                # "Expecting value" well before the end of the buffer (further than a cut-off
                # '-Infinity' reaches): no later text can fix it, so read no further.
                if self.eof or (e.msg == "Expecting value" and len(self.buf) - e.pos > 9):
                    raise DatasetError(f"{self.name} line {self.line(e.pos)}: invalid JSON "
                                       f"({e.msg})") from None
            except ValueError as e:  # an integer of more digits than Python converts
                raise DatasetError(f"{self.name} line {self.line()}: invalid JSON "
                                   f"({_short(e)})") from None
            except RecursionError:
                raise DatasetError(f"{self.name} line {self.line()}: JSON nested too "
                                   "deeply") from None
            if len(self.buf) - self.pos > MAX_LINE_BYTES:
                raise DatasetError(f"{self.name} line {self.line()}: a value longer than "
                                   f"{_size(MAX_LINE_BYTES)}; no prompt is that long")
            self._more()

    def items(self):
        """The items of the list whose '[' comes next; checks the document ends after it."""
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
        else:
            while True:
                yield self.value()
                if self.expect(",]") == "]":
                    break
        self._end()

    def enter_first_list(self) -> None:
        """Inside {...}: skip members up to the first whose value is a list."""
        self.expect("{")
        while self.peek() != "}":
            key = self.value()
            if not isinstance(key, str):
                raise DatasetError(f"{self.name} line {self.line()}: invalid JSON (object key "
                                   "is not a string)")
            self.expect(":")
            if self.peek() == "[":
                self.nested = True
                return
            self.value()
            if self.expect(",}") == "}":
                break
        raise DatasetError(f"{self.name} line 1: expected a list of records, or an object "
                           "holding exactly one list")

    def _end(self) -> None:
        """After the records: the wrapper's other members (no second list), then only blanks."""
        if self.nested:
            while self.expect(",}") == ",":
                self.value()
                self.expect(":")
                if isinstance(self.value(), list):
                    raise DatasetError(f"{self.name} line {self.line()}: expected a list of "
                                       "records, or an object holding exactly one list")
        if self.peek():
            raise DatasetError(f"{self.name} line {self.line()}: invalid JSON (extra data "
                               "after the records)")
