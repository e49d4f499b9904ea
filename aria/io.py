"""File I/O shared by every step: validated JSON / JSONL reading and atomic writes.

Every reader raises :class:`DataError` naming the file, the line (or sample index) and the field
of the first problem, so a user can open the file at that line and fix it. Every writer writes a
temporary file in the destination folder and renames it over the target, so a crash never leaves
a half-written output behind; the file gets the permissions the umask gives a new file (a shared
cluster's teammates can read results). What is written passes through :mod:`aria.secrets`: JSON
objects lose the values of secret-named keys, and no text keeps an API key from the environment.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import hashlib
import io
import json
import json.decoder
import json.scanner
import math
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from aria.secrets import redact, redact_text
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): matplotlib


class DataError(ValueError):
    """Bad input data; the message names file, line / sample and field."""

    def __init__(self, path: str | os.PathLike | None, line: int | None, field: str | None, problem: str):
        self.path, self.line, self.field, self.problem = path, line, field, problem
        where = [str(path) if path is not None else "<data>"]
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{': '.join([', '.join(where), problem])}")


class ConfigError(ValueError):
    """A setting that cannot work; the message names the setting (``train.optimizer: ...``)."""


class ResumeMismatch(ValueError):
    """Work to be resumed (a games file, a checkpoint) was made under other settings than this run's."""


def model_digest(folder: str | os.PathLike) -> str:
    """Which weights a model folder holds, without reading them whole: each weight file's name and
    size and a digest of its first and last MiB (a safetensors file's header and the bytes of its
    first and last tensors). Two trainings of one architecture differ there; a copy does not."""
    folder = Path(folder)
    h = hashlib.sha256()
    files = sorted(f for f in folder.rglob("*") if f.is_file() and f.suffix in (".safetensors", ".bin", ".pt", ".gguf"))
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(folder)}\0{size}\0".encode())
        with f.open("rb") as handle:
            h.update(handle.read(1 << 20))
            if size > 2 << 20:
                handle.seek(-(1 << 20), os.SEEK_END)
                h.update(handle.read(1 << 20))
    config = folder / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    return h.hexdigest()[:16]


@contextmanager
def located(path: str | os.PathLike | None, line: int | None) -> Iterator[None]:
    """Name ``path`` and ``line`` in a :class:`DataError` raised inside the block by code that sees
    one record but not the file it came from (the corpus, a prompt renderer)."""
    try:
        yield
    except DataError as error:
        if error.path is None and path is not None:
            raise DataError(path, line, error.field, error.problem) from None
        raise


def check_writable(folder: str | os.PathLike) -> Path:
    """Make ``folder`` if needed and write a file in it, so that a folder that cannot take the
    results (read-only, forbidden, a file in its place) fails at the start of a run with its
    ``OSError``, not at the end of it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=folder)
    os.close(fd)
    os.unlink(probe)
    return folder


def check_output_file(path: str | os.PathLike, setting: str) -> Path:
    """A file a command writes at its end, checked at its start: not a folder (else the error would
    name the temporary file), in a folder it can write (:func:`check_writable`)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{setting}: {path} is a folder; give the file to write (e.g. {path / 'result.json'})")
    check_writable(path.parent)
    return path


class InUse(RuntimeError):
    """Another process holds the output this command writes (:func:`hold_output`)."""


class StaleInput(ValueError):
    """A file that is not what the step reading it expects (made by another run, or under other
    settings): a command says so in one line, naming what to re-run (the pipeline's steps:
    ``aria.intention.pipeline.StaleStep``)."""


#: The locks this process holds: lock file -> [descriptor, holds, folder it made or None]. Held
#: again by the same process (a trainer run twice in one process, a writer opened again), a lock is
#: counted, not refused.
_HELD: dict[str, list] = {}


def hold_output(output: str | os.PathLike, what: str = "", is_file: bool = False, beside: bool = False) -> Path:
    """Hold ``output`` (a folder, or with ``is_file`` a file's name) for this process, or raise :class:`InUse` at
    once naming the process that holds it; :func:`release_output` lets it go, the end of the
    process in any case. ``beside``: a folder replaced whole (a copy, a merged model), whose lock
    is ``<folder>.lock`` beside it, as a file's is.

    Two commands resuming into the same output would interleave and duplicate its games, metrics
    or checkpoints, so every resumable output has one writer: an exclusive ``flock`` on
    ``folder/.lock`` (a folder) or ``<file>.lock`` (a file). The kernel releases it when the process
    ends, however it ends (SIGKILL included): a lock is never left to be removed by hand. Released
    (or at a normal exit) the lock file is removed, and so is a folder the hold made that is still
    empty: a refused command leaves nothing behind. The file holds the holder's PID and start time
    only, never its command line (which may hold a key)."""
    output = Path(output)
    made = None
    if is_file or beside:  # its lock beside the output itself (a symbolic link to it is the same output)
        output.parent.mkdir(parents=True, exist_ok=True)
        real = resolved(output, what)
        if is_file and real.exists() and not real.is_file():  # a pipe would block the reader, a device swallow the games
            raise ConfigError(f"{what + ': ' if what else ''}{output} is not a regular file (a folder, a pipe or a "
                              "device): give the path of a file")
        path = real.with_name(real.name + ".lock")
    else:
        made = None if output.exists() else output.resolve()
        output.mkdir(parents=True, exist_ok=True)
        path = output / ".lock"
    key = str(path.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return path
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise InUse(f"{what + ': ' if what else ''}{output} is in use by {holder}: wait for it to end (or stop it), "
                        f"or give this one another output") from None
        # The holder before us removes its lock file as it lets go: if it did so after we opened
        # the file, we hold a name no one else sees, so open the name afresh.
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"process {os.getpid()} (started {time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode(), 0)
    _HELD[key] = [fd, 1, made]
    return path


def writer_of(path: str | os.PathLike) -> str | None:
    """Who is writing the file ``path`` (another process's :func:`hold_output` of it), or None: a
    reader of a games file still being played would take the games finished so far for all of them."""
    real = Path(path).resolve()
    lock = real.with_name(real.name + ".lock")
    if str(lock) in _HELD:  # this process writes it (an online run labelling its own rollouts)
        return None
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def resolved(path: Path, setting: str = "") -> Path:
    """``path`` with its symbolic links followed, or one line naming ``setting`` for a loop of links
    (pathlib's RuntimeError, a traceback otherwise)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as err:
        raise ConfigError(f"{setting + ': ' if setting else ''}{path}: its symbolic links lead nowhere ({err})") from None


def release_output(lock: Path) -> None:
    """Let go of a hold :func:`hold_output` took (it returned ``lock``), once every hold is released."""
    key = str(Path(lock).resolve())
    if key in _HELD:
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            _let_go(key)


def _let_go(key: str) -> None:
    """Remove the lock file while still holding it (see the check in :func:`hold_output`), then the
    folder the hold made if nothing was written into it, then let go."""
    fd, _, made = _HELD.pop(key)
    try:
        Path(key).unlink(missing_ok=True)
        if made is not None:
            try:
                made.rmdir()  # only if empty: anything written there stays
            except OSError:
                pass
    finally:
        os.close(fd)


def _release_all() -> None:
    """At a normal exit: the holds a command keeps to its end (a trainer's output_dir)."""
    for key in list(_HELD):
        _let_go(key)


atexit.register(_release_all)


@contextmanager
def hold_folder(folder: str | os.PathLike, what: str = "") -> Iterator[None]:
    """:func:`hold_output` of ``folder`` while the block runs."""
    lock = hold_output(folder, what)
    try:
        yield
    finally:
        release_output(lock)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace`` (atomic on POSIX);
    secret values from the environment are redacted (:func:`aria.secrets.redact_text`)."""
    text = redact_text(text)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate from some reader: name the line, write nothing
        line = text.count("\n", 0, err.start) + 1
        raise DataError(path, line, None, f"not written: character {err.start - text.rfind(chr(10), 0, err.start) - 1} "
                                          "of this line is half of a UTF-16 surrogate pair, which UTF-8 cannot hold") from None
    atomic_write_bytes(path, data)


def new_file_mode() -> int:
    """The permissions ``open()`` would give a new file under the current umask (0o644 under 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace`` (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, new_file_mode())  # mkstemp makes 0600 whatever the umask
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- fingerprints: is this output still the one these settings and inputs make? -------------
def json_digest(obj: Any, length: int | None = 16, sort_keys: bool = True) -> str:
    """sha256 of ``obj`` written as JSON (keys sorted), its first ``length`` hex digits (None: all
    64): the fingerprint of a set of settings or of data, recorded beside an output and compared
    on every re-run or resume. Values JSON cannot write are written as ``str``."""
    text = json.dumps(obj, sort_keys=sort_keys, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def file_digest(paths: str | os.PathLike | list, length: int | None = 16) -> str:
    """sha256 of the bytes of one file, or of several read one after the other."""
    h = hashlib.sha256()
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:length]


def atomic_save_figure(fig, path: str | os.PathLike, **savefig_kwargs) -> None:
    """A matplotlib figure written whole or not at all (rendered in memory, then
    :func:`atomic_write_bytes`); the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **savefig_kwargs)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def replace_folder(new: Path, out: Path, keep_old_as: Path | None = None) -> Path:
    """Put the finished folder ``new`` at ``out``, its files with the permissions of the umask. The
    old ``out`` is first moved aside (to ``keep_old_as`` when given, else to ``<out>.old`` and then
    deleted), so ``out`` is at every moment either the old folder or the new one, never half of each."""
    out = Path(out)
    aside = Path(keep_old_as) if keep_old_as else out.with_name(out.name + ".old")
    # safetensors writes its files -rw------- whatever the umask: give them what any other output gets
    mode = new_file_mode()
    for file in Path(new).rglob("*"):
        if file.is_file() and not file.is_symlink():
            file.chmod(mode)
    if out.exists():
        shutil.rmtree(aside, ignore_errors=True)
        out.rename(aside)
    Path(new).rename(out)
    if not keep_old_as:
        shutil.rmtree(aside, ignore_errors=True)
    return out


def check_output_folder(dest: str | os.PathLike, sources: Sequence[str | os.PathLike], what: str,
                        previous: Callable[[Path], bool], setting: str = "") -> Path:
    """Refuse, in one line before any work, an output folder that replacing would destroy
    something: one of ``sources`` itself, a folder inside one (or holding one), a file, or a
    folder that holds anything but a previous ``what`` (``previous(dest)`` says whether it is
    one: the same command's earlier output, which it may replace); or one another process is
    making (:func:`hold_output`, held to the end of this process). Returns the folder to write:
    ``dest`` with its symbolic links followed, the folder that was checked and is held (a link
    itself is never replaced by a folder of its own)."""
    name = f"{setting}: " if setting else ""
    if Path(dest).is_symlink() and not Path(dest).exists():  # else the copy is staged, then cannot be put there
        raise ConfigError(f"{name}{dest} is a symbolic link to {os.readlink(dest)}, which does not exist: give a folder")
    out = resolved(Path(dest), setting)
    for source in sources:
        src = Path(source).resolve()
        if out == src:
            raise ConfigError(f"{name}{dest} is {source} itself: the {what} would replace what it is made from")
        if src in out.parents:
            raise ConfigError(f"{name}{dest} lies inside {source}, what the {what} is made from: choose a folder outside it")
        if out in src.parents:
            raise ConfigError(f"{name}{dest} holds {source}, what the {what} is made from: replacing it would delete that")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{name}{dest} is a file, not a folder")
    if file := next((p for p in out.parents if p.exists() and not p.is_dir()), None):
        raise ConfigError(f"{name}{dest} lies under {file}, a file: give a folder that can be made")
    # one writer: a second command making the same folder waits for no one, it is refused
    hold_output(out, f"{setting or what}", beside=True)
    if out.is_dir() and any(out.iterdir()) and not previous(out):  # (after the hold: what another writer left counts)
        raise ConfigError(f"{name}{dest} holds files that are not a previous {what}: it is not replaced "
                          "(remove it yourself, or choose an empty or new folder)")
    return out


@contextmanager
def atomic_folder(out: str | os.PathLike, keep_old_as: str | os.PathLike | None = None) -> Iterator[Path]:
    """A folder written whole or not at all (a saved model, a merged model): write into the
    yielded ``<out>.tmp``; when the block ends it replaces ``out`` (:func:`replace_folder`), and
    when the block raises it is removed and ``out`` is left as it was."""
    out = Path(out)
    if out.exists() and not out.is_dir():  # a file is no old folder to move aside: never replace it
        raise FileExistsError(errno.EEXIST, "a file, not a folder", str(out))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_folder(tmp, out, Path(keep_old_as) if keep_old_as else None)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> None:
    """``obj`` as strict JSON, secret-named keys redacted (every config, summary and report comes
    here). A NaN or infinite number (an undefined p-value, a variance of no steps) is written as
    ``null``: Python would write ``NaN``, which jq, browsers and ``datasets`` refuse to read."""
    text = json.dumps(finite_or_null(redact(obj)), indent=indent, ensure_ascii=False, allow_nan=False)
    atomic_write_text(path, text + "\n")


def finite_or_null(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (numpy's included) replaced by ``None``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def atomic_write_json_rows(path: str | os.PathLike, rows: list) -> None:
    """A JSON array with one element per line: as readable as ``indent``, but written by the C
    encoder (``indent`` falls back to the pure-Python one, 5x slower on a training set)."""
    body = ",\n".join(_strict_row(row, path, line) for line, row in enumerate(rows, start=2))
    atomic_write_text(path, f"[\n{body}\n]\n" if rows else "[]\n")


def atomic_write_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    atomic_write_text(path, "".join(_strict_row(r, path, line) + "\n" for line, r in enumerate(records, start=1)))


def _strict_row(row: Any, path: str | os.PathLike, line: int) -> str:
    """One row as strict JSON. Unlike a report's undefined statistic, a NaN in a training row or a
    game (a diverged critic's advantage, a reward of no steps) is a bug upstream: writing ``null``
    would hide it until a trainer reads the file, so nothing is written and the row is named."""
    try:
        return json.dumps(row, ensure_ascii=False, allow_nan=False)
    except ValueError:
        field = find_non_finite(row)
        if field is None:
            raise
        raise DataError(path, line, field, "not written: NaN and infinity are not JSON "
                                           "(and no reward or advantage should be one)") from None


def _not_a_file(path: Path) -> DataError | None:
    if not path.exists():
        return DataError(path, None, None, "file not found")
    if not path.is_file():
        return DataError(path, None, None, "is a folder, not a file" if path.is_dir() else "not a regular file")
    return None


def _decode(path: Path, data: bytes, line: int | None = None) -> str:
    """``data`` as UTF-8; bad bytes are named by file, line and position instead of a traceback."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        at = line if line is not None else data[: err.start].count(b"\n") + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1)
        raise DataError(path, at, None, f"not UTF-8 text: byte 0x{data[err.start]:02x} at column {column + 1} "
                                        f"({err.reason}); convert the file to UTF-8") from None


#: Python's JSON reader recurses once per level of nesting; no game or config nests this deep.
TOO_DEEP = "JSON nested too deeply to read (thousands of levels): not a file of this project's kinds"


#: A JSON escape of half a UTF-16 surrogate pair (\uD800-\uDFFF): the only way a line can hold one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def find_lone_surrogate(value: Any, where: str = "") -> tuple[str, int] | None:
    """``(field, character)`` of the first string in ``value`` that holds half of a UTF-16 pair
    alone: Python reads the escape, but no UTF-8 file can hold it, so every later write would fail."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return where or "(the value)", err.start
    elif isinstance(value, dict):
        for key, item in value.items():
            field = f"{where}.{key}" if where else str(key)
            if found := find_lone_surrogate(key, f"{field} (its name)") or find_lone_surrogate(item, field):
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if found := find_lone_surrogate(item, f"{where}[{i}]"):
                return found
    return None


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``"a.b was 1, now 2"`` for each setting that differs between two nested dicts of settings."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new), key=str)
                for d in differences(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [f"{prefix.rstrip('.')} was {old!r}, now {new!r}"]


def find_non_finite(value: Any, where: str = "") -> str | None:
    """The field of the first NaN or infinite number in ``value``: Python writes them as ``NaN`` and
    ``Infinity``, which are not JSON, so no other tool (jq, datasets) reads the file after."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(the value)"
    if isinstance(value, dict):
        for key, item in value.items():
            if found := find_non_finite(item, f"{where}.{key}" if where else str(key)):
                return found
    elif isinstance(value, (list, tuple)):  # json writes a tuple as a list
        for i, item in enumerate(value):
            if found := find_non_finite(item, f"{where}[{i}]"):
                return found
    return None


class _DuplicateKey(ValueError):
    def __init__(self, key: str, position: int | None = None):
        super().__init__(key)
        self.key, self.position = key, position


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """An object's pairs as a dict, refusing a key given twice: every JSON reader silently keeps
    the last value, so ``{"success": true, ..., "success": false}`` would be read as a loss."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return value


def _duplicate_key_offset(text: str) -> int | None:
    """Where in ``text`` the first object with a repeated key starts: the JSON parsed again with
    the standard library's pure-Python scanner, whose object parser knows its offset (slow; only
    after a repeated key was found, to name its line in a file that is one JSON document)."""
    def parse_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        pairs, end = json.decoder.JSONObject(s_and_end, strict, scan_once, None, list, memo)
        try:
            return _unique_keys(pairs), end
        except _DuplicateKey as err:
            raise _DuplicateKey(err.key, s_and_end[1]) from None

    decoder = json.JSONDecoder()
    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    try:
        decoder.decode(text)
    except _DuplicateKey as err:
        return err.position
    except (ValueError, RecursionError):
        return None
    return None


def parse_json(text: str, path: str | os.PathLike | None, line: int | None) -> Any:
    """``json.loads`` with every way it fails as one :class:`DataError` naming file and line (and
    the field, for half a surrogate pair or a key given twice in one object)."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
        found = find_lone_surrogate(value) if _SURROGATE_ESCAPE.search(text) else None
    except json.JSONDecodeError as err:
        raise DataError(path, line if line is not None else err.lineno, None,
                        f"invalid JSON ({err.msg}, column {err.colno})") from None
    except RecursionError:
        raise DataError(path, line, None, TOO_DEEP) from None
    except _DuplicateKey as err:
        if line is None and (offset := _duplicate_key_offset(text)) is not None:
            line = text.count("\n", 0, offset) + 1  # the line where that object starts
        raise DataError(path, line, err.key, "given twice in one object: which value is meant is not "
                                             "known (a JSON reader would silently keep the last)") from None
    except ValueError as err:  # an integer of more digits than Python converts (4,300 by default)
        if line is None and (digits := re.search(r"\d{4301,}", text)):
            line = text.count("\n", 0, digits.start()) + 1
        raise DataError(path, line, None, f"invalid JSON ({' '.join(str(err).split())[:200]})") from None
    if found:
        raise DataError(path, line, found[0], f"character {found[1]} is half of a UTF-16 surrogate pair (a lone "
                                              "\\uD800-\\uDFFF escape): not text; the file was written by a broken encoder")
    return value


def read_json(path: str | os.PathLike) -> Any:
    """Load a JSON file; a syntax error or bytes that are not UTF-8 name the file and line."""
    path = Path(path)
    if (problem := _not_a_file(path)) is not None:
        raise problem
    return parse_json(_decode(path, path.read_bytes()), path, None)


def iter_jsonl(path: str | os.PathLike, allow_partial_last_line: bool = False) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-empty line of a JSONL file.

    ``allow_partial_last_line``: a last line without a trailing newline that does not parse is
    taken as a write cut short by a crash and skipped instead of raising (used when resuming).
    """
    path = Path(path)
    if (problem := _not_a_file(path)) is not None:
        raise problem
    lines = path.read_bytes().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        is_last = number == len(lines)  # no newline after it
        try:
            line = _decode(path, raw, number)
        except DataError:
            if allow_partial_last_line and is_last:  # a multi-byte character cut by a crash
                return
            raise
        if not line.strip():
            continue
        try:
            obj = parse_json(line, path, number)
        except DataError:
            if allow_partial_last_line and is_last:  # a write cut short by a crash
                return
            raise
        if not isinstance(obj, dict):
            raise DataError(path, number, None, f"expected a JSON object, got {type(obj).__name__}")
        yield number, obj


def require(obj: dict, field: str, types: type | tuple[type, ...], path, line) -> Any:
    """Return ``obj[field]`` after checking presence and type (``bool`` is not accepted as a number)."""
    if field not in obj:
        raise DataError(path, line, field, "missing")
    value = obj[field]
    wanted = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in wanted:
        raise DataError(path, line, field, f"expected {'/'.join(t.__name__ for t in wanted)}, got bool")
    if not isinstance(value, wanted):
        raise DataError(path, line, field, f"expected {'/'.join(t.__name__ for t in wanted)}, got {type(value).__name__}")
    return value


def is_finite_number(value: Any) -> bool:
    """An int or float (not a bool) that is neither NaN nor infinite, nor an integer beyond a
    float's range (JSON allows ``1`` and 400 zeros; it would be infinite as a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
