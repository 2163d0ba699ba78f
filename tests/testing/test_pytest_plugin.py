"""The pytest plugin, as a user's test suite meets it: a test file in a
directory of its own, run by pytest in a fresh process that loads the
plugin through the installed package's entry point."""

import textwrap

import pytest

USER_TESTS = textwrap.dedent('''
    import os
    import time

    import numpy as np
    import pytest

    from localcluster import (LocalHostScheduler, LocalSession, Node, Task,
                              TaskGroup, WorkspaceType, ops)

    SEEN = []

    def group():
        with TaskGroup(WorkspaceType.GLOBAL) as g:
            with Node("a"), Task():
                ops.Const(np.arange(3.0), name="x")
        return g

    @pytest.mark.localcluster(leak_check=True, timeout=60)
    def test_any_session_runs(any_session):
        any_session.run(group())
        assert any_session.fetch_blob("x", "a").tolist() == [0, 1, 2]
        SEEN.append(any_session)

    def test_the_kinds_and_their_closing(local_session, localhost_scheduler):
        assert isinstance(local_session, LocalSession)
        assert isinstance(localhost_scheduler, LocalHostScheduler)
        localhost_scheduler.run(group())
        assert sorted(type(s).__name__ for s in SEEN) == \\
            ["LocalHostScheduler", "LocalSession"]
        assert not any(s.is_open() for s in SEEN)   # closed after their test

    @pytest.mark.usefixtures("localhost_scheduler")
    @pytest.mark.localcluster
    def test_a_session_fixture_closes_before_the_leak_check_looks():
        pass

    @pytest.mark.localcluster(leek_check=True)
    def test_a_misspelt_marker_fails_this_test_only():
        pass
''')

LEAKY_TESTS = textwrap.dedent('''
    import os
    import time

    import numpy as np
    import pytest

    from localcluster import LocalHostScheduler, Node, Task, TaskGroup, ops

    KEPT = []

    def group():
        with TaskGroup() as g:
            with Node("a"), Task():
                ops.Const(np.arange(3.0), name="x")
        return g

    @pytest.mark.localcluster(leak_check=True)
    def test_leaves_a_node_process():
        session = LocalHostScheduler()
        session.run(group())
        KEPT.append(session)     # never closed

    @pytest.mark.localcluster
    def test_leaves_a_pipe():
        KEPT.append(os.pipe())

    @pytest.mark.localcluster(leak_check=True)
    def test_clean(localhost_scheduler):
        localhost_scheduler.run(group())

    def test_after_the_leaks_nothing_of_them_is_left():
        import psutil
        assert not [p for p in psutil.Process().children()
                    if p.status() != psutil.STATUS_ZOMBIE]
        # the leaked scheduler knows its nodes are gone: it closes at once
        start = time.monotonic()
        KEPT[0].close()
        assert time.monotonic() - start < 1.0

    @pytest.mark.localcluster(timeout=0.5)
    def test_too_slow():
        time.sleep(30)
''')


RAY_TESTS = textwrap.dedent('''
    import numpy as np
    import pytest

    from localcluster import Node, Task, TaskGroup, WorkspaceType, ops

    PIDS = []

    def group():
        with TaskGroup(WorkspaceType.GLOBAL) as g:
            with Node("a"), Task():
                ops.Const(np.arange(3.0), name="x")
        return g

    @pytest.mark.localcluster(leak_check=True, timeout=60)
    @pytest.mark.parametrize("example", range(3))
    def test_each_example_gets_a_fresh_node(any_session, example):
        assert any_session.blobs("a") == []
        any_session.run(group())
        assert any_session.fetch_blob("x", "a").tolist() == [0, 1, 2]
        PIDS.append(any_session.node_pids()["a"])

    def test_the_module_shared_one_warm_actor():
        assert len(PIDS) == 3 and len(set(PIDS)) == 1
''')


def test_any_session_under_ray_shares_warm_actors_in_a_module(pytester):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    pytester.makepyfile(test_on_ray=RAY_TESTS)
    result = pytester.runpytest_subprocess(
        "-q", "--strict-markers", "-p", "no:cacheprovider",
        "--localcluster-sessions", "ray")
    result.assert_outcomes(passed=4)


def test_fixtures_give_open_sessions_of_each_kind_closed_after(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess(
        "-q", "--strict-markers", "-p", "no:cacheprovider",
        "--localcluster-sessions", "local,localhost")
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_a_misspelt_marker_fails_this_test_only*",
        "*takes leak_check= and timeout=, got*leek_check*"])


def test_localcluster_sessions_narrows_any_session(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess(
        "-v", "-p", "no:cacheprovider", "--localcluster-sessions", "local",
        "-k", "any_session")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_any_session_runs?local? PASSED*"])


def test_an_unknown_session_kind_is_a_usage_error(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--localcluster-sessions", "local,mars")
    assert result.ret == 4     # pytest's usage error
    result.stderr.fnmatch_lines(["*mars*is no installed session kind*"])


def test_the_marker_fails_leaks_and_overtime_and_passes_a_clean_test(
        pytester):
    pytester.makepyfile(test_leaky=LEAKY_TESTS)
    for timer in ([], ["-p", "no:timeout"]):   # pytest-timeout, or not
        result = pytester.runpytest_subprocess(
            "-v", "--strict-markers", "-p", "no:cacheprovider", *timer)
        result.assert_outcomes(passed=4, errors=2, failed=1)
        out = result.stdout.str()
        assert "ERROR at teardown of test_leaves_a_node_process" in out
        assert "child process" in out and "/dev/shm/lc_" in out
        assert "ERROR at teardown of test_leaves_a_pipe" in out
        assert "file descriptor" in out and "pipe:" in out
        result.stdout.fnmatch_lines(["*test_clean PASSED*",
                                     "*test_after_the_leaks_nothing_of_them"
                                     "_is_left PASSED*",
                                     "*test_too_slow FAILED*"])
        assert "Timeout" in out or "ran longer than" in out
