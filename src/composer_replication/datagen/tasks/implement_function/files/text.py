def is_palindrome(s):
    """True when ``s`` reads the same backwards, ignoring case and non-alphanumeric characters."""
    return None  # TODO: implement
