from app import page_url


def test_page_url():
    assert page_url("Hello, World!") == "/pages/hello-world"
    assert page_url("  A  b ") == "/pages/a-b"
