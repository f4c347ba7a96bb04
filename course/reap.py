"""Reaping: what a notebook's run left running is found, named and stopped.

A notebook's launches can outlive it: a cell timeout shuts the kernel down, and torchrun's workers and the
Web-UI run in sessions of their own. The runner makes itself their subreaper (:func:`adopt_orphans`), so that
they come back to it rather than to init, and stops every process below it when a notebook ends
(:func:`stop_children`), naming them (:func:`described`).
"""

from __future__ import annotations

import os

import psutil

# prctl(2), PR_SET_CHILD_SUBREAPER (<linux/prctl.h>, Linux 3.4 and later): with arg2 nonzero, the calling
# process becomes the "child subreaper" of its descendants, which are reparented to it, not to init, when
# their own parent dies.
PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process the subreaper of everything below it (``prctl(PR_SET_CHILD_SUBREAPER, 1)``): a launch
    whose kernel died is then reparented here rather than to init, so :func:`stop_children` still finds it.
    False where the call is not there (not Linux) or fails."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_children(exclude=()) -> int:
    """Stop every process this one started (the kernel and whatever it launched), but those in ``exclude``
    (pids); how many stopped. Where this process is a subreaper (:func:`adopt_orphans`), that includes what a
    dead kernel's launches left behind."""
    from helpers.launching import kill_tree

    return sum(kill_tree(child.pid) for child in psutil.Process().children() if child.pid not in exclude)


def described(processes) -> str:
    """What the processes are, by the start of their command lines, for a message: the program by its name
    alone (``python``, not a long checkout's path to its .venv), then the first arguments, which say what
    it is."""
    said = []
    for proc in processes:
        try:
            words = proc.cmdline()[:4]
            said.append(" ".join([os.path.basename(words[0]), *words[1:]])[:120] if words else proc.name())
        except psutil.Error:
            continue
    return "; ".join(said) or "(gone before they could be named)"
