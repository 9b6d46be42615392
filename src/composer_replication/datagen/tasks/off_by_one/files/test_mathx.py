from mathx import sum_to


def test_small():
    assert sum_to(1) == 1
    assert sum_to(3) == 6


def test_zero_and_negative():
    assert sum_to(0) == 0
    assert sum_to(-4) == 0


def test_formula():
    for n in range(50):
        assert sum_to(n) == n * (n + 1) // 2
