"""A failed script's last words in one line (``hopbus.runtime.command.cause``): what
``hopbus launch`` says when a copy of the user's script exits with an error."""

from hopbus.runtime.command import cause


def test_an_exception_is_named_with_where_it_was_raised():
    tail = [
        "Traceback (most recent call last):",
        '  File "/home/u/train.py", line 12, in <module>',
        "    main()",
        '  File "/home/u/train.py", line 9, in main',
        "    1 / 0",
        "ZeroDivisionError: division by zero",
    ]
    assert cause(tail) == "ZeroDivisionError: division by zero (train.py, line 9, in main)"


def test_a_syntax_error_is_named_with_its_file_and_line():
    tail = [
        '  File "/home/u/train.py", line 3',
        "    ctx = hopbus.join(",
        "                     ^",
        "SyntaxError: '(' was never closed",
    ]
    assert cause(tail) == "SyntaxError: '(' was never closed (train.py, line 3)"


def test_other_output_is_its_last_lines():
    assert cause(["loading", "out of memory"]) == "loading | out of memory"
    assert cause([]) == "it printed nothing on stderr"
