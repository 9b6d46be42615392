import sys

from text import is_palindrome

CASES = [
    ("", True),
    ("a", True),
    ("Racecar", True),
    ("A man, a plan, a canal: Panama", True),
    ("hello", False),
    ("ab", False),
    ("No lemon, no melon", True),
]

failed = [(s, want) for s, want in CASES if is_palindrome(s) is not want]
for s, want in failed:
    print(f"FAIL is_palindrome({s!r}) should be {want}")
print("ok" if not failed else f"{len(failed)} failed")
sys.exit(1 if failed else 0)
