from game import fizzbuzz


def test_returns_a_list_of_n_items():
    assert len(fizzbuzz(7)) == 7


def test_plain_numbers():
    assert fizzbuzz(2) == ["1", "2"]


def test_fizz():
    assert fizzbuzz(3)[2] == "Fizz"


def test_buzz():
    assert fizzbuzz(5)[4] == "Buzz"


def test_fizzbuzz():
    assert fizzbuzz(15)[14] == "FizzBuzz"
