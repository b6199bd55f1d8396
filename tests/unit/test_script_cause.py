"""A failed script's last words in one line (``hopbus.runtime.last_words.cause``): what
``hopbus launch`` says when a copy of the user's script exits with an error, and ``hopbus
train`` when a worker running a user's model does."""

from hopbus.runtime.last_words import cause


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


def test_a_syntax_error_in_an_imported_library_is_named_where_it_is():
    """Not at the script's import line as if the script did not compile."""
    tail = [
        "Traceback (most recent call last):",
        '  File "/home/u/loop.py", line 29, in <module>',
        "    import hopbus",
        '  File "/venv/lib/python3.11/site-packages/hopbus/api.py", line 120',
        "    global _joined",
        "SyntaxError: name '_joined' is used prior to global declaration",
    ]
    assert cause(tail) == (
        "SyntaxError: name '_joined' is used prior to global declaration "
        "(api.py, line 120, imported from loop.py, line 29)"
    )


def test_other_output_is_its_last_lines():
    assert cause(["loading", "out of memory"]) == "loading | out of memory"
    assert cause([]) == "it printed nothing on stderr"


def test_a_multi_line_message_is_named_by_its_first_line_not_its_last():
    tail = [
        "Traceback (most recent call last):",
        '  File "/home/u/multiline.py", line 1, in <module>',
        '    raise ValueError("first line\\nsecond line")',
        "ValueError: first line",
        "second line",
    ]
    assert cause(tail) == "ValueError: first line (multiline.py, line 1, in <module>)"


SITE = "/v/lib/python3.11/site-packages"


def test_a_keras_lead_in_is_followed_by_its_telling_line_and_the_users_own_frame():
    """Keras's message starts with a lead-in, coloured, and ends with its arguments; the
    place is the last frame in the user's code, not Keras's."""
    tail = [
        "Traceback (most recent call last):",
        '  File "/home/u/mymod2.py", line 20, in <module>',
        "    model.fit(x, y)",
        f'  File "{SITE}/keras/src/layers/input_spec.py", line 239, in assert_input_compatibility',
        "    raise ValueError(",
        "ValueError: Exception encountered when calling Sequential.call().",
        "",
        "\x1b[1mInput 0 of layer 'dense' is incompatible with the layer: expected axis -1 of "
        "input shape to have value 30, but received input with shape (None, 64)\x1b[0m",
        "",
        "Arguments received by Sequential.call():",
        "  \u2022 kwargs=<class 'inspect._empty'>",
    ]
    assert cause(tail) == (
        "ValueError: Exception encountered when calling Sequential.call(). Input 0 of layer "
        "'dense' is incompatible with the layer: expected axis -1 of input shape to have value "
        "30, but received input with shape (None, 64) (mymod2.py, line 20, in <module>)"
    )


def test_a_tensorflow_graph_error_says_what_went_wrong_not_its_node():
    tail = [
        "Traceback (most recent call last):",
        '  File "/home/u/kbad.py", line 12, in <module>',
        "    model.fit(x, y, callbacks=[HopCallback(ctx)])",
        f'  File "{SITE}/tensorflow/python/eager/execute.py", line 53, in quick_execute',
        "    tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,",
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:",
        "",
        "Detected at node compile_loss/sparse_categorical_crossentropy defined at (most recent "
        "call last):",
        '  File "/home/u/kbad.py", line 12, in <module>',
        "",
        f'  File "{SITE}/keras/src/backend/tensorflow/nn.py", line 1438, in sparse_categorical',
        "",
        "Received a label value of 4 which is outside the valid range of [0, 2).",
        "\t [[{{node compile_loss/sparse_categorical_crossentropy/SparseSoftmax}}]] "
        "[Op:__inference_multi_step_on_iterator_671]",
    ]
    assert cause(tail) == (
        "InvalidArgumentError: Graph execution error: Received a label value of 4 which is "
        "outside the valid range of [0, 2). (kbad.py, line 12, in <module>)"
    )


def test_only_library_frames_name_the_last_of_them():
    tail = [
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 88, in _run_code',
        f'  File "{SITE}/numpy/core/fromnumeric.py", line 9, in reshape',
        "    return x",
        "ValueError: cannot reshape array of size 3 into shape (2,)",
    ]
    assert cause(tail) == (
        "ValueError: cannot reshape array of size 3 into shape (2,) (fromnumeric.py, line 9, "
        "in reshape)"
    )


def test_an_error_line_is_the_scripts_account_only_as_its_last_word():
    """``said``: a ``hopbus: error:`` line counts as the script's own account of its failure
    unless a traceback follows it (then it came from something the script ran, before the
    script's real crash, which ``cause`` names)."""
    from hopbus.runtime.last_words import said

    mine = ["loading", "hopbus: error: worker 1: log(): unknown metric 'val_acc'"]
    assert said(mine) == "worker 1: log(): unknown metric 'val_acc'"
    assert said([*mine, "hopbus: worker 1 left the run", ""]) == mine[1][len("hopbus: error: ") :]
    assert said([*mine, "myscript: fatal: disk full"]) is None  # the script's own last word
    crashed = [
        "hopbus: error: no run 'x' in this Redis",
        "Traceback (most recent call last):",
        '  File "/home/u/train.py", line 7, in <module>',
        '    raise ValueError("the real cause")',
        "ValueError: the real cause",
    ]
    assert said(crashed) is None
    assert cause(crashed) == "ValueError: the real cause (train.py, line 7, in <module>)"
    assert said(["no error line at all"]) is None


def test_a_line_without_end_on_stderr_is_copied_in_bounded_reads():
    """Fault ``endless_line``: 3 MB without a newline, then a traceback. Each read and each
    write is at most READ_BYTES; the tail keeps the long line's head once, then every line
    of the traceback."""
    import io

    from hopbus.runtime.command import KEPT_CHARS, READ_BYTES, _Pump

    class Sink(io.RawIOBase):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def write(self, b) -> int:  # type: ignore[override]
            self.sizes.append(len(b))
            return len(b)

    source = io.BytesIO(b"#" * 3_000_000 + b"\nTraceback (most recent call last):\nValueError: x\n")
    sink = Sink()
    pump = _Pump(source, sink)  # type: ignore[arg-type]
    pump.run()
    assert max(sink.sizes) <= READ_BYTES and sum(sink.sizes) == pump.copied
    head, *rest = pump.tail
    assert head == "#" * KEPT_CHARS
    assert rest == ["Traceback (most recent call last):", "ValueError: x"]


def test_a_missing_package_that_an_extra_installs_comes_with_its_command():
    """A Keras script launched without TensorFlow: the line says how to install it, as
    ``hopbus train --model cnn`` does; a package hopbus does not install gets no hint."""

    def tail(module: str) -> list[str]:
        return [
            "Traceback (most recent call last):",
            '  File "/home/u/keras_cnn.py", line 33, in <module>',
            f"    import {module}",
            f"ModuleNotFoundError: No module named '{module}'",
        ]

    assert cause(tail("keras")) == (
        "ModuleNotFoundError: No module named 'keras' (keras_cnn.py, line 33, in <module>); "
        "install it: pip install -e '.[tf]'"
    )
    assert cause(tail("torch.nn")).endswith(
        "install it: pip install torch --index-url https://download.pytorch.org/whl/cpu"
    )
    assert cause(tail("pandas")).endswith("(keras_cnn.py, line 33, in <module>)")
