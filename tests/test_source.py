"""``lowering.source.compile_function``: generated code readable while alive, forgotten after."""

import gc
import linecache
import traceback

from lowering.source import compile_function

SOURCE = """
def f(xs):
    return [1 / x for x in xs]
"""


def _file_of_error(fn) -> str:
    try:
        fn([0])
    except ZeroDivisionError as exc:
        return traceback.extract_tb(exc.__traceback__)[-1].filename
    raise AssertionError("no error raised")


def test_the_source_is_readable_under_its_own_name_while_the_function_lives():
    scope = {"unused": 1}
    f = compile_function(SOURCE, scope, "f")
    assert f([2, 4]) == [0.5, 0.25]
    filename = f.__code__.co_filename
    assert filename.startswith("<purefx code #")
    assert "".join(linecache.getlines(filename)) == SOURCE
    assert scope == {"unused": 1}  # the caller's scope is copied, not filled
    del f
    gc.collect()
    assert filename not in linecache.cache


def test_the_same_source_twice_gives_two_names_down_to_nested_code():
    f = compile_function(SOURCE, {}, "f")
    g = compile_function(SOURCE, {}, "f")
    assert f.__code__.co_filename != g.__code__.co_filename
    # the error is raised inside the comprehension: its nested code carries the name too
    assert _file_of_error(f) == f.__code__.co_filename
    assert _file_of_error(g) == g.__code__.co_filename
    assert "1 / x" in linecache.getline(_file_of_error(g), 3)


def test_generated_code_does_not_inherit_this_modules_future_flags():
    h = compile_function("def h(x: int) -> int:\n    return x\n", {}, "h")
    assert h.__annotations__ == {"x": int, "return": int}  # not strings: no future flag
