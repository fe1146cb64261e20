"""The one atomic write, the readers of user files and the output-path check."""

import re

import pytest

from mismatch.errors import InputError
from mismatch.files import atomic_write, atomic_write_text, check_writable, read_json, read_text


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = atomic_write_text(tmp_path / "sub" / "f.json", "old")
    assert path.read_text() == "old"

    def half_then_fail(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old" and sorted(p.name for p in path.parent.iterdir()) == ["f.json"]
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and sorted(p.name for p in path.parent.iterdir()) == ["f.json"]


def test_readers_and_the_output_check_say_what_is_wrong_in_one_line(tmp_path):
    (tmp_path / "bad.json").write_text("{1")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9")
    for call, message in ((lambda: read_text(tmp_path / "none.txt", "prompts file"), "prompts file not found"),
                          (lambda: read_text(tmp_path, "prompts file"), "is a directory, not a file"),
                          (lambda: read_text(tmp_path / "latin.txt", "prompts file"), "not UTF-8 text (byte 3 is 0xe9)"),
                          (lambda: read_json(tmp_path / "bad.json", "config"), "not valid JSON"),
                          (lambda: check_writable(tmp_path / "latin.txt" / "x", "results", folder=True), "is a file"),
                          (lambda: check_writable(tmp_path, "thresholds", folder=False), "is a folder, not a file")):
        with pytest.raises(InputError, match=re.escape(message)) as info:
            call()
        assert "\n" not in str(info.value)
    check_writable(tmp_path / "new" / "deeper", "results", folder=True)
    assert not (tmp_path / "new").exists()  # the check creates nothing
