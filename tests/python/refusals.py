"""The one check of bad-input tests: each call raises the exception kind given, and its message names the argument
(the Python API's rule: a TypeError or ValueError naming what was wrong, never a crash or a silent fix)."""


def assert_each_refused(test, cases):
    """cases: (exception kind, a text the message must contain, a call taking no arguments)."""
    for kind, name, call in cases:
        with test.subTest(name=name):
            with test.assertRaises(kind) as caught:
                call()
            test.assertIn(name, str(caught.exception))
