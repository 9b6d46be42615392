import calc


def test_add():
    assert calc.add(2, 3) == 5


def test_sub_exists():
    assert callable(getattr(calc, "sub", None))


def test_sub_ints():
    assert calc.sub(5, 3) == 2


def test_sub_negative():
    assert calc.sub(-1, 4) == -5
