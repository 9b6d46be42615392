import config


def test_debug_is_off():
    assert config.DEBUG is False


def test_name_kept():
    assert config.NAME == "app"


def test_port_kept():
    assert config.PORT == 8080
