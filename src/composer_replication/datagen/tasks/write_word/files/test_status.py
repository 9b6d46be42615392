from pathlib import Path


def test_file_exists():
    assert Path("status.txt").is_file()


def test_says_done():
    assert Path("status.txt").read_text().strip() == "done"


def test_todo_is_gone():
    assert "todo" not in Path("status.txt").read_text()
