"""CourseError: what a learner did wrong and what would be right, in one sentence, no traceback."""


class CourseError(Exception):
    """An error whose message is the whole story; notebooks show it without a traceback."""


def _short_traceback(shell, etype, value, tb, tb_offset=None):
    """IPython custom-exception handler: one red line instead of a stack of frames."""
    line = f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}"
    shell._showtraceback(etype, value, [line])
    return [line]


def install_notebook_handler() -> None:
    """Inside IPython/Jupyter, show CourseError (and subclasses) as one line."""
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: ordinary tracebacks
        return
    shell = get_ipython()
    if shell is not None:
        shell.set_custom_exc((CourseError,), _short_traceback)
