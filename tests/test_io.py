"""Whole-or-nothing writes of folders and figures (aria/io.py): a saved model, a merged model, a
checkpoint or a plot is at every moment either the old one or the new one."""
from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from aria.io import atomic_folder, atomic_save_figure, replace_folder  # noqa: E402


def _folder(path, **files):
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _contents(path):
    return {p.name: p.read_text() for p in path.iterdir()}


def test_a_finished_block_replaces_the_folder_and_leaves_nothing_beside_it(tmp_path):
    out = _folder(tmp_path / "model", **{"weights": "old", "stale": "only in the old folder"})
    with atomic_folder(out) as tmp:
        assert tmp != out and tmp.is_dir() and _contents(out) == {"weights": "old", "stale": "only in the old folder"}
        (tmp / "weights").write_text("new")
    assert _contents(out) == {"weights": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_block_that_raises_leaves_the_old_folder_and_no_partial_one(tmp_path):
    out = _folder(tmp_path / "model", weights="old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_folder(out) as tmp:
            (tmp / "weights").write_text("half")
            raise KeyboardInterrupt
    assert _contents(out) == {"weights": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_leftover_of_a_killed_write_is_cleared_and_a_new_folder_is_made(tmp_path):
    _folder(tmp_path / "model.tmp", weights="torn")
    with atomic_folder(tmp_path / "deep" / "model") as tmp:  # parents made; no old folder
        (tmp / "weights").write_text("new")
    assert _contents(tmp_path / "deep" / "model") == {"weights": "new"}
    with atomic_folder(tmp_path / "model") as tmp:
        assert list(tmp.iterdir()) == []  # the torn leftover is not carried into the new folder
        (tmp / "weights").write_text("new")
    assert _contents(tmp_path / "model") == {"weights": "new"}
    assert not (tmp_path / "model.tmp").exists()


def test_the_old_folder_can_be_kept_under_another_name(tmp_path):
    """merge_if_adapter keeps the adapter it merged as <model>.adapter."""
    out = _folder(tmp_path / "rm", adapter_config="lora")
    _folder(tmp_path / "rm.adapter", adapter_config="an older adapter")
    with atomic_folder(out, keep_old_as=tmp_path / "rm.adapter") as tmp:
        (tmp / "model").write_text("merged")
    assert _contents(out) == {"model": "merged"}
    assert _contents(tmp_path / "rm.adapter") == {"adapter_config": "lora"}


def test_replace_folder_moves_a_finished_folder_in(tmp_path):
    new = _folder(tmp_path / "step-4.tmp", state="4")
    final = _folder(tmp_path / "step-4", state="an earlier try")
    assert replace_folder(new, final) == final
    assert _contents(final) == {"state": "4"} and sorted(p.name for p in tmp_path.iterdir()) == ["step-4"]


def test_a_figure_is_written_whole_with_no_temporary_file_left(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    out = tmp_path / "plots" / "curve.png"
    atomic_save_figure(fig, out, dpi=50, metadata={"Software": None})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["curve.png"]
    assert not plt.fignum_exists(fig.number)  # closed


def test_a_report_with_undefined_numbers_is_strict_json_with_nulls(tmp_path):
    import json
    import math

    import numpy as np

    from aria.io import atomic_write_json

    out = tmp_path / "report.json"
    atomic_write_json(out, {"p": float("nan"), "ratio": [1.5, np.float64("inf"), -math.inf], "k": 3,
                            "nested": {"var": np.nan, "ok": 0.25}})
    strict = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert strict == {"p": None, "ratio": [1.5, None, None], "k": 3, "nested": {"var": None, "ok": 0.25}}


def test_a_lone_surrogate_is_named_by_line_and_nothing_is_written(tmp_path):
    """Half a UTF-16 pair can reach a string only through a reader's escape; UTF-8 cannot hold it,
    so the write names the line and the file there stays as it was."""
    from aria.io import DataError, atomic_write_jsonl

    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    with pytest.raises(DataError, match=r"out\.jsonl, line 2: not written: character 11 of this line is half"):
        atomic_write_jsonl(path, [{"a": "fine"}, {"a": "bad \ud800"}])
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


@pytest.mark.parametrize("text, problem", [
    ('[{"reward": 1' + "0" * 5000 + "}]", "line 1: invalid JSON (Exceeds the limit (4300 digits)"),
    ('[{"action": "a"},\n {"action": "b \\udc00"}]', "field '[1].action': character 2 is half of a UTF-16 surrogate pair"),
    # a key given twice: the line where its object starts, found again after the fast parse
    ('[{"action": "a", "weight": 1.0},\n {"action": "b",\n  "weight": 0.5, "weight": -0.5}]',
     "line 2, field 'weight': given twice in one object"),
    ('{"samples": [{"meta": {"seed": 1, "seed": 2}}]}', "line 1, field 'seed': given twice in one object"),
], ids=["too-many-digits", "lone-surrogate", "repeated-key", "repeated-nested-key"])
def test_json_that_python_reads_but_cannot_use_is_one_line(tmp_path, text, problem):
    from aria.io import DataError, read_json

    path = tmp_path / "train.json"
    path.write_text(text)
    with pytest.raises(DataError, match=re.escape(f"{path}, {problem}")):
        read_json(path)


def test_a_key_given_twice_in_a_jsonl_line_names_the_line_and_the_field(tmp_path):
    """``success`` written twice in one game: every JSON reader keeps the last value silently, so
    a won game would be read as lost (or the reverse); the reader refuses it instead."""
    from aria.io import DataError, iter_jsonl

    path = tmp_path / "games.jsonl"
    path.write_text('{"game_id": "a", "success": true}\n{"game_id": "b", "success": true, "success": false}\n')
    with pytest.raises(DataError, match=re.escape(f"{path}, line 2, field 'success': given twice in one object")):
        list(iter_jsonl(path))


@pytest.mark.parametrize("writer, line", [("atomic_write_json_rows", 3), ("atomic_write_jsonl", 2)])
def test_a_nan_in_a_row_is_named_by_line_and_field_and_nothing_is_written(tmp_path, writer, line):
    """Training rows and games are not reports: an undefined number there is a bug upstream, so the
    write refuses it (a report writes null instead: the test above)."""
    import aria.io
    from aria.io import DataError

    path = tmp_path / "train.json"
    path.write_text("old\n")
    rows = [{"reward": 1.0, "advantage": 0.5}, {"reward": None, "critic": {"q": [0.1, float("inf")]}}]
    with pytest.raises(DataError, match=re.escape(f"{path}, line {line}, field 'critic.q[1]': not written: NaN")):
        getattr(aria.io, writer)(path, rows)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["train.json"]
    getattr(aria.io, writer)(path, rows[:1] + [{"reward": None}])  # null (a step not kept) is fine
    assert "null" in path.read_text()
    tuple_rows = [{"reward": 1.0}, {"span": (0, float("nan"))}]  # json writes a tuple as a list
    with pytest.raises(DataError, match=re.escape(f"line {line}, field 'span[1]'")):
        getattr(aria.io, writer)(path, tuple_rows)
