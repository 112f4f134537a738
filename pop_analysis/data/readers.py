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


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


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


def parquet_records(path: Path, name: str | None = None, batch_rows: int = 256):
    """(where, record) per row, read a batch of rows at a time."""
    name = name or str(path)
    try:
        import pyarrow.parquet as pq

        batches = pq.ParquetFile(path).iter_batches(batch_size=batch_rows)
        i = 0
        for batch in batches:
            for rec in batch.to_pylist():
                i += 1
                yield f"row {i}", rec
    except DatasetError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds for a damaged file
        raise DatasetError(f"{name}: not a readable Parquet file ({first_line(e)})") from None


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
